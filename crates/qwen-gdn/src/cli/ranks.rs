//! How `generate` and `chat` run over ranks: under `mpirun -n N` (a build with the `mpi`
//! feature), or as ranks of an NCCL job on one host's CUDA GPUs (a build with the `nccl`
//! feature), each process is one rank of the plan `--parallel` names (a pipeline stage, or a
//! share of every layer). `--ranks N` on one host starts the ranks itself: with `--device cuda`
//! one a GPU over NCCL (`qwen_gdn_collective::run_nccl_job`), otherwise `mpirun -n N` of this
//! very binary with the same arguments.

use crate::load::DeviceChoice;
use anyhow::{bail, Context, Result};
use qwen_gdn_collective::World;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct RankArgs {
    /// Run as N processes on this host, the model split between them by `--parallel`: with
    /// `--device cuda`, one a GPU over NCCL (a build with the `nccl` feature); otherwise under
    /// `mpirun -n N` (Open MPI and a build with the `mpi` feature). Across hosts, start the
    /// binary under `mpirun` yourself
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub ranks: Option<u32>,
    /// How the model is split over the ranks: `pipeline` (each rank a contiguous range of
    /// layers; for hosts joined by slow links), `experts` (each rank a share of every MoE
    /// block's experts, the rest on every rank), `tensor` (each rank a share of every GDN and
    /// attention layer's heads, the rest on every rank) or `tensor-experts` (both); all but
    /// `pipeline` run the reference plan, f32 on the CPU
    #[arg(long, value_enum, default_value_t = ParallelKind::Pipeline)]
    pub parallel: ParallelKind,
    /// How long a rank waits for another's activation, token or reduction before it ends,
    /// with one line naming the rank that is gone (died, or its link stalled)
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub rank_timeout: u64,
}

/// The plans `--parallel` chooses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ParallelKind {
    Pipeline,
    Experts,
    Tensor,
    TensorExperts,
}

/// Environment variables a launcher sets in every rank it starts: Open MPI's, then the PMI
/// ones of MPICH's Hydra (and Slurm).
const WORLD_SIZE_VARS: [&str; 2] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"];

/// The number of ranks the launcher that started this process asked for (1 outside one).
fn launched_size() -> usize {
    WORLD_SIZE_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(1)
}

/// This process's rank of the job `mpirun` or an NCCL launcher started, when it started more
/// than one; `None` when the run is a single process.
pub fn launched_world(rank_timeout: u64) -> Result<Option<World>> {
    if let Some(env) = qwen_gdn_collective::NcclRankEnv::from_env()? {
        return nccl_world(&env, rank_timeout).map(Some);
    }
    if launched_size() <= 1 {
        return Ok(None);
    }
    #[cfg(feature = "mpi")]
    {
        let world =
            qwen_gdn_collective::MpiWorld::launched(std::time::Duration::from_secs(rank_timeout))?;
        Ok((world.size() > 1).then_some(world))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = rank_timeout;
        bail!(
            "started by mpirun with {} ranks, but this qwen-gdn was built without MPI (cargo build --release --features mpi)",
            launched_size()
        )
    }
}

/// This rank of the NCCL job `env` describes, on this process's CUDA GPU.
#[cfg(feature = "nccl")]
fn nccl_world(env: &qwen_gdn_collective::NcclRankEnv, rank_timeout: u64) -> Result<World> {
    qwen_gdn_collective::NcclWorld::launched(env, std::time::Duration::from_secs(rank_timeout))
}

#[cfg(not(feature = "nccl"))]
fn nccl_world(env: &qwen_gdn_collective::NcclRankEnv, _rank_timeout: u64) -> Result<World> {
    bail!(
        "started as rank {} of an NCCL job of {}, but this qwen-gdn was built without NCCL (scripts/gpu/build-cuda.sh)",
        env.rank,
        env.ranks
    )
}

/// `--ranks N`: runs this binary again as N ranks with the same arguments minus `--ranks`
/// (over NCCL, one a GPU, for `--device cuda`; under `mpirun` otherwise) and ends with the
/// job's exit status.
pub fn spawn_ranks(ranks: u32, device: DeviceChoice) -> Result<ExitCode> {
    if device == DeviceChoice::Cuda {
        return spawn_nccl_job(ranks);
    }
    spawn_under_mpirun(ranks)
}

/// This process's arguments without `--ranks N`: what every rank it starts runs.
fn rank_args() -> Vec<String> {
    let mut args = vec![];
    let mut rest = std::env::args().skip(1);
    while let Some(arg) = rest.next() {
        if arg == "--ranks" {
            rest.next();
        } else if !arg.starts_with("--ranks=") {
            args.push(arg);
        }
    }
    args
}

#[cfg(feature = "nccl")]
fn spawn_nccl_job(ranks: u32) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("--ranks: finding this binary")?;
    let code = qwen_gdn_collective::run_nccl_job(ranks as usize, &exe, &rank_args())?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

#[cfg(not(feature = "nccl"))]
fn spawn_nccl_job(_ranks: u32) -> Result<ExitCode> {
    bail!("--ranks with --device cuda needs a qwen-gdn built with NCCL (scripts/gpu/build-cuda.sh)")
}

/// `--ranks N` under `mpirun -n N`.
fn spawn_under_mpirun(ranks: u32) -> Result<ExitCode> {
    if !cfg!(feature = "mpi") {
        bail!("--ranks needs a qwen-gdn built with MPI (cargo build --release --features mpi)");
    }
    let exe = std::env::current_exe().context("--ranks: finding this binary")?;
    let args = rank_args();
    let mut mpirun = std::process::Command::new("mpirun");
    // Open MPI refuses root unless told, and more ranks than cores unless told.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        mpirun.arg("--allow-run-as-root");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ranks as usize > cores {
        mpirun.arg("--oversubscribe");
    }
    mpirun.args(["-n", &ranks.to_string()]).arg(exe).args(args);
    let mut child = match mpirun.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("--ranks: mpirun is not on PATH (install Open MPI: apt install openmpi-bin, brew install open-mpi)")
        }
        Err(e) => bail!("--ranks: cannot start mpirun: {e}"),
    };
    qwen_gdn_collective::forward_sigterm_to(child.id());
    let status = child.wait().context("--ranks: waiting for mpirun")?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
