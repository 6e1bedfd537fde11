//! `--ranks N` on a host with several CUDA GPUs: this process starts N copies of a program, one
//! GPU each, as one NCCL job, and stands for the job until every rank has ended (the role
//! `mpirun` plays for MPI ranks).
//!
//! - The launcher makes the job's NCCL id and hands it to every rank with its rank number
//!   ([`crate::nccl_world::NcclRankEnv`]); each rank sees only its own GPU
//!   (`CUDA_VISIBLE_DEVICES`, taken from the launcher's own list when it has one).
//! - A SIGTERM to the launcher goes on to every rank (`launched_children.rs`); Ctrl-C reaches
//!   them from the terminal.
//! - When one rank ends with a failure (its own error, or a crash), the launcher stops the others
//!   (SIGTERM: each ends with its one line, `launcher_stop.rs`), and after [`GRACE`] kills what
//!   is left, so that no rank waits forever for the one that is gone. The job's exit status is
//!   the first failing rank's.

use crate::launched_children::{forward_sigterm_to, signal_children, MAX_CHILDREN};
use crate::nccl_world::new_job_id;
use crate::rank_env::{NCCL_ID_VAR, RANKS_VAR, RANK_VAR};
use crate::rank_gpus::rank_gpus;
use anyhow::{bail, ensure, Context, Result};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// How long the other ranks get to end after the launcher stopped them.
const GRACE: Duration = Duration::from_secs(10);

/// Runs `program args` as `ranks` ranks of one NCCL job on this host's GPUs and returns the
/// job's exit code (0 when every rank succeeded).
pub fn run_nccl_job(ranks: usize, program: &Path, args: &[String]) -> Result<i32> {
    ensure!(
        (1..=MAX_CHILDREN).contains(&ranks),
        "--ranks {ranks}: one host runs 1 to {MAX_CHILDREN} ranks"
    );
    let host_devices = cudarc::driver::CudaContext::device_count()
        .map_err(|e| anyhow::anyhow!("--ranks: no CUDA driver ({e:?})"))?;
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let gpus = rank_gpus(ranks, visible.as_deref(), host_devices.max(0) as usize)?;
    let id = new_job_id()?;
    let mut children: Vec<Child> = Vec::with_capacity(ranks);
    for (rank, gpu) in gpus.iter().enumerate() {
        let mut command = Command::new(program);
        command
            .args(args)
            .env(NCCL_ID_VAR, &id)
            .env(RANK_VAR, rank.to_string())
            .env(RANKS_VAR, ranks.to_string())
            .env("CUDA_VISIBLE_DEVICES", gpu);
        match command.spawn() {
            Ok(child) => {
                forward_sigterm_to(child.id());
                children.push(child);
            }
            Err(e) => {
                signal_children(libc::SIGKILL);
                bail!(
                    "--ranks: cannot start rank {rank} ({}): {e}",
                    program.display()
                );
            }
        }
    }
    wait_for_job(children)
}

/// Waits for every rank; on the first failure stops the rest (see the module's comment).
fn wait_for_job(mut children: Vec<Child>) -> Result<i32> {
    let mut codes: Vec<Option<i32>> = vec![None; children.len()];
    let mut failed: Option<i32> = None;
    let mut stopped_at: Option<Instant> = None;
    while codes.iter().any(Option::is_none) {
        for (rank, child) in children.iter_mut().enumerate() {
            if codes[rank].is_some() {
                continue;
            }
            if let Some(status) = child
                .try_wait()
                .with_context(|| format!("--ranks: waiting for rank {rank}"))?
            {
                let code = status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(1));
                if code != 0 && failed.is_none() {
                    if let Some(signal) = status.signal() {
                        // A crashed rank printed nothing: the launcher names it.
                        eprintln!("error: rank {rank} ended with signal {signal}");
                    }
                    failed = Some(code);
                }
                codes[rank] = Some(code);
            }
        }
        if failed.is_some() && stopped_at.is_none() && codes.iter().any(Option::is_none) {
            signal_children(libc::SIGTERM);
            stopped_at = Some(Instant::now());
        }
        if stopped_at.is_some_and(|t| t.elapsed() > GRACE) {
            signal_children(libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(failed.unwrap_or(0))
}
