//! [`Collective`] on NCCL (through cudarc's bindings), for ranks that each own one CUDA GPU of
//! a host: `--ranks N` with `--device cuda` starts them ([`crate::rank_launch`]).
//!
//! The trait's buffers are host `f32` slices (the plans send one activation `[S, H]` per stage
//! boundary and step, and the reference plans reduce host tensors), so each call stages its
//! slice through a device buffer of this rank's GPU: copy in, the NCCL operation on this world's
//! own stream, copy out. NCCL then moves the bytes over NVLink or PCIe between the GPUs. Plans
//! that keep their activations on the device would call NCCL on device buffers directly; the
//! calls keep this shape (peer, count, sum).
//!
//! NCCL waits forever for a peer that never comes: every operation here is followed by a poll
//! of its stream bounded by the deadline ([`NcclWorld::set_deadline`]), which then fails with
//! one line naming the ranks (a rank that died, or a stalled link) and refuses the communicator
//! from then on; the launcher stops the other ranks once this one has ended.

use crate::poll_pause::PollPause;
use crate::rank_env::NcclRankEnv;
use crate::Collective;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::{Comm, Id, ReduceOp};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A new communicator id for a job, in the hex form [`crate::rank_env::NCCL_ID_VAR`] carries
/// (NCCL's bootstrap address: the launcher makes it, every rank joins with it).
pub fn new_job_id() -> Result<String> {
    let id = Id::new().map_err(|e| anyhow!("NCCL: cannot make a job id ({e:?})"))?;
    Ok(id
        .internal()
        .iter()
        .map(|&b| format!("{:02x}", b as u8))
        .collect())
}

/// This process's rank of an NCCL job. Each rank sees its own GPU as device 0 (the launcher
/// sets `CUDA_VISIBLE_DEVICES` per rank), so the model and the communicator share it.
pub struct NcclWorld {
    inner: Mutex<Inner>,
    rank: usize,
    size: usize,
}

struct Inner {
    comm: Comm,
    stream: Arc<CudaStream>,
    deadline: Option<Duration>,
    /// Set once an operation ran past its deadline: the communicator was aborted.
    broken: bool,
}

// SAFETY: NCCL allows a communicator to be used from any thread as long as calls do not
// overlap; every use goes through the mutex. The stream and its context are cudarc handles that
// bind the context to the calling thread before each call.
unsafe impl Send for Inner {}

impl NcclWorld {
    /// Joins the job `env` describes on CUDA device 0 (this rank's GPU). Blocks until every rank
    /// has joined; a rank that never comes is the launcher's to end (it stops the job when any
    /// rank exits).
    fn join(env: &NcclRankEnv) -> Result<Self> {
        let context = CudaContext::new(0)
            .map_err(|e| anyhow!("rank {}: no CUDA device for NCCL ({e:?})", env.rank))?;
        let stream = context
            .new_stream()
            .map_err(|e| anyhow!("rank {}: cannot make a CUDA stream ({e:?})", env.rank))?;
        let id = Id::uninit(env.id_bytes().map(|b| b as std::ffi::c_char));
        let comm = Comm::from_rank(stream.clone(), env.rank, env.ranks, id).map_err(|e| {
            anyhow!(
                "rank {}: cannot join the NCCL job of {} ranks ({e:?})",
                env.rank,
                env.ranks
            )
        })?;
        Ok(Self {
            inner: Mutex::new(Inner {
                comm,
                stream,
                deadline: None,
                broken: false,
            }),
            rank: env.rank,
            size: env.ranks,
        })
    }

    /// This rank of the NCCL job `env` describes as the plans hold it: every operation bounded
    /// by `deadline`, and a launcher's SIGTERM ending the rank with one line.
    pub fn launched(env: &NcclRankEnv, deadline: Duration) -> Result<crate::World> {
        let world = Self::join(env)?;
        world.set_deadline(Some(deadline));
        world.end_with_one_line_when_stopped();
        Ok(Arc::new(world))
    }

    /// From now on, a SIGTERM from the launcher (which stops every rank once one has ended)
    /// ends this rank with one line naming it, exit code 143 (`launcher_stop.rs`).
    fn end_with_one_line_when_stopped(&self) {
        crate::launcher_stop::install(self.rank);
    }

    /// From now on an operation that its peers do not complete within `deadline` fails with one
    /// line naming the ranks, and the communicator is refused after it (the caller is expected
    /// to end the process).
    fn set_deadline(&self, deadline: Option<Duration>) {
        self.lock().deadline = deadline;
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn peer(&self, rank: usize) -> Result<i32> {
        ensure!(
            rank < self.size && rank != self.rank,
            "rank {rank} is not a peer of rank {} (the job has {} ranks)",
            self.rank,
            self.size
        );
        Ok(rank as i32)
    }
}

impl Inner {
    fn usable(&self, me: usize) -> Result<()> {
        ensure!(
            !self.broken,
            "rank {me}: the NCCL communicator is out of step after an earlier timeout"
        );
        Ok(())
    }

    fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(data)
            .map_err(|e| anyhow!("NCCL staging copy to the GPU: {e:?}"))
    }

    /// A zeroed device buffer of `len` values, for NCCL to write into.
    fn receiving<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(len)
            .map_err(|e| anyhow!("NCCL receive buffer: {e:?}"))
    }

    fn download<T: DeviceRepr>(&self, buf: &CudaSlice<T>, data: &mut [T]) -> Result<()> {
        self.stream
            .memcpy_dtoh(buf, data)
            .map_err(|e| anyhow!("NCCL staging copy from the GPU: {e:?}"))
    }

    /// Waits for the work queued on the stream, polling so that a peer that never comes ends
    /// the wait at `deadline` (or never, with `None`); `what(seconds)` is the line then.
    fn wait(&mut self, deadline: Option<Duration>, what: impl Fn(u64) -> String) -> Result<()> {
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| anyhow!("NCCL: recording an event: {e:?}"))?;
        let mut pause = PollPause::new();
        loop {
            match done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => bail!("NCCL operation failed on the GPU: {e:?}"),
            }
            if deadline.is_some_and(|d| pause.elapsed() > d) {
                // The kernel waiting for the peer never ends by itself: the communicator is
                // refused from now on, and the caller ends the process (which frees the GPU;
                // dropping a cudarc `Comm` would abort it).
                self.broken = true;
                bail!("{}", what(deadline.map_or(0, |d| d.as_secs())));
            }
            pause.pause();
        }
    }

    fn receive(
        &mut self,
        me: usize,
        from: usize,
        peer: i32,
        data: &mut [f32],
        deadline: Option<Duration>,
    ) -> Result<()> {
        self.usable(me)?;
        let mut buf = self.receiving::<f32>(data.len())?;
        self.comm
            .recv(&mut buf, peer)
            .map_err(|e| anyhow!("rank {me}: NCCL receive from rank {from}: {e:?}"))?;
        self.wait(deadline, |s| {
            format!(
                "rank {me}: nothing from rank {from} within {s} s (it died or the link stalled)"
            )
        })?;
        self.download(&buf, data)
    }
}

impl Collective for NcclWorld {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&self, to: usize, data: &[f32]) -> Result<()> {
        let (me, peer) = (self.rank, self.peer(to)?);
        let mut inner = self.lock();
        inner.usable(me)?;
        let buf = inner.upload(data)?;
        inner
            .comm
            .send(&buf, peer)
            .map_err(|e| anyhow!("rank {me}: NCCL send to rank {to}: {e:?}"))?;
        let deadline = inner.deadline;
        inner.wait(deadline, |s| {
            format!("rank {me}: rank {to} took nothing within {s} s (it died or the link stalled)")
        })
    }

    fn receive(&self, from: usize, data: &mut [f32]) -> Result<()> {
        let (me, peer) = (self.rank, self.peer(from)?);
        let mut inner = self.lock();
        let deadline = inner.deadline;
        inner.receive(me, from, peer, data, deadline)
    }

    fn receive_waiting(&self, from: usize, data: &mut [f32]) -> Result<()> {
        let (me, peer) = (self.rank, self.peer(from)?);
        self.lock().receive(me, from, peer, data, None)
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let me = self.rank;
        let mut inner = self.lock();
        inner.usable(me)?;
        let mut buf = inner.upload(data)?;
        inner
            .comm
            .all_reduce_in_place(&mut buf, &ReduceOp::Sum)
            .map_err(|e| anyhow!("rank {me}: NCCL all-reduce: {e:?}"))?;
        let deadline = inner.deadline;
        inner.wait(deadline, |s| {
            format!("rank {me}: a reduction over every rank did not complete within {s} s (a rank died or a link stalled)")
        })?;
        inner.download(&buf, data)
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let me = self.rank;
        let mut inner = self.lock();
        inner.usable(me)?;
        let mine = inner.upload(&[value])?;
        let mut all = inner.receiving::<u64>(self.size)?;
        inner
            .comm
            .all_gather(&mine, &mut all)
            .map_err(|e| anyhow!("rank {me}: NCCL all-gather: {e:?}"))?;
        let deadline = inner.deadline;
        inner.wait(deadline, |s| {
            format!("rank {me}: a gather over every rank did not complete within {s} s (a rank died or a link stalled)")
        })?;
        let mut out = vec![0u64; self.size];
        inner.download(&all, &mut out)?;
        Ok(out)
    }
}
