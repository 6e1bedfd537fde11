//! [`Collective`] on MPI (Open MPI here, Homebrew's on a Mac) through rsmpi.

use crate::poll_pause::PollPause;
use crate::Collective;
use anyhow::{anyhow, bail, ensure, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::point_to_point::Status;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Destination, Source};
use mpi::Rank;
use std::time::Duration;

/// The MPI world of this process. MPI allows one initialization per process, so there is one
/// `MpiWorld` per process; dropping it finalizes MPI.
pub struct MpiWorld {
    // Declared before the universe: the communicator must go before MPI is finalized.
    world: SimpleCommunicator,
    _universe: mpi::environment::Universe,
    /// How long a send or a receive may wait for its peer before it fails
    /// ([`MpiWorld::set_deadline`]); `None` waits forever.
    deadline: Option<Duration>,
}

impl MpiWorld {
    /// Initializes MPI. Outside `mpirun` this is a world of one rank.
    ///
    /// With serialized threading: any thread may call MPI, one at a time. An expert-parallel
    /// plan exchanges from inside the forward pass, which runs on the CPU pool's workers
    /// ([`SharedMpiWorld`] serializes those calls).
    pub fn init() -> Result<Self> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| anyhow!("MPI was already initialized in this process"))?;
        ensure!(
            threading >= mpi::Threading::Serialized,
            "this MPI library offers only {threading:?} threading; serialized calls from several threads are needed"
        );
        Ok(Self {
            world: universe.world(),
            _universe: universe,
            deadline: None,
        })
    }

    /// This process's rank of the `mpirun` job as the plans hold it: every send, receive and
    /// sum bounded by `deadline`, and a launcher's SIGTERM ending the rank with one line.
    pub fn launched(deadline: Duration) -> Result<crate::World> {
        let mut world = Self::init()?;
        world.set_deadline(Some(deadline));
        world.end_with_one_line_when_stopped();
        Ok(std::sync::Arc::new(SharedMpiWorld::new(world)))
    }

    /// From now on, a SIGTERM from the launcher (which stops every rank once one has ended)
    /// ends this rank with one line naming it, exit code 143 (`launcher_stop.rs`).
    fn end_with_one_line_when_stopped(&self) {
        crate::launcher_stop::install(self.rank());
    }

    /// From now on a send or a receive that its peer does not complete within `deadline` fails
    /// with one line naming both ranks (a rank that died or a link that stalled), instead of
    /// blocking forever. The transfer is then abandoned: its buffer is leaked, since MPI may
    /// still touch it, and the caller is expected to end the process.
    fn set_deadline(&mut self, deadline: Option<Duration>) {
        self.deadline = deadline;
    }

    /// Polls `request` until it completes or the deadline passes. On time, the buffer MPI
    /// was given comes back to be freed; late, it stays leaked with the request (see
    /// [`MpiWorld::set_deadline`]).
    fn finish<B: ?Sized>(
        &self,
        request: Request<'static, B, StaticScope>,
        what: impl Fn(u64) -> String,
    ) -> Result<Status> {
        self.finish_within(request, self.deadline, what)
    }

    /// [`MpiWorld::finish`] with `deadline` (`None`: polls for as long as it takes, the core
    /// given back between polls, where MPI's own wait would spin it).
    fn finish_within<B: ?Sized>(
        &self,
        mut request: Request<'static, B, StaticScope>,
        deadline: Option<Duration>,
        what: impl Fn(u64) -> String,
    ) -> Result<Status> {
        let deadline = deadline.unwrap_or(Duration::MAX);
        let mut pause = PollPause::new();
        loop {
            match request.test() {
                Ok(status) => return Ok(status),
                Err(pending) => request = pending,
            }
            if pause.elapsed() > deadline {
                std::mem::forget(request);
                bail!("{}", what(deadline.as_secs()));
            }
            pause.pause();
        }
    }

    /// A receive polled until it completes or `deadline` passes, into a buffer of its own, so
    /// that a receive from a dead rank can be abandoned (MPI may write the buffer until the
    /// request completes).
    fn receive_polled(
        &self,
        from: usize,
        data: &mut [f32],
        deadline: Option<Duration>,
    ) -> Result<()> {
        let peer = self.peer(from)?;
        let buf: &'static mut [f32] = Box::leak(vec![0f32; data.len()].into_boxed_slice());
        let ptr: *mut [f32] = buf;
        let request = self
            .world
            .process_at_rank(peer)
            .immediate_receive_into(StaticScope, buf);
        let me = self.rank();
        let status = self.finish_within(request, deadline, |s| {
            format!(
                "rank {me}: nothing from rank {from} within {s} s (it died or the link stalled)"
            )
        })?;
        // SAFETY: the request completed, so MPI no longer writes the buffer, and `ptr` is the
        // only way left to it.
        let got = unsafe { Box::from_raw(ptr) };
        data.copy_from_slice(&got);
        expect_count(from, &status, data.len())
    }

    fn peer(&self, rank: usize) -> Result<Rank> {
        ensure!(
            rank < self.size(),
            "rank {rank} does not exist (the job has {} ranks)",
            self.size()
        );
        Ok(rank as Rank)
    }
}

impl Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn send(&self, to: usize, data: &[f32]) -> Result<()> {
        let peer = self.peer(to)?;
        if self.deadline.is_none() {
            self.world.process_at_rank(peer).send(data);
            return Ok(());
        }
        // A non-blocking send on a buffer of its own, so that a send to a dead rank can be
        // abandoned (MPI may read the buffer until the request completes).
        let buf: &'static mut [f32] = Box::leak(data.to_vec().into_boxed_slice());
        let ptr: *mut [f32] = buf;
        let request = self
            .world
            .process_at_rank(peer)
            .immediate_send(StaticScope, &*buf);
        let me = self.rank();
        self.finish(request, |s| {
            format!("rank {me}: rank {to} took nothing within {s} s (it died or the link stalled)")
        })?;
        // SAFETY: the request completed, so MPI no longer reads the buffer, and `ptr` is the
        // only way left to it.
        drop(unsafe { Box::from_raw(ptr) });
        Ok(())
    }

    fn receive(&self, from: usize, data: &mut [f32]) -> Result<()> {
        match self.deadline {
            None => {
                let peer = self.peer(from)?;
                let status = self.world.process_at_rank(peer).receive_into(data);
                expect_count(from, &status, data.len())
            }
            Some(_) => self.receive_polled(from, data, self.deadline),
        }
    }

    fn receive_waiting(&self, from: usize, data: &mut [f32]) -> Result<()> {
        // Polled rather than MPI's blocking wait, which spins a core for as long as the
        // person takes.
        self.receive_polled(from, data, None)
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let mine = data.to_vec();
        if self.deadline.is_none() {
            self.world
                .all_reduce_into(&mine[..], data, SystemOperation::sum());
            return Ok(());
        }
        // Non-blocking on buffers of its own, so that a reduction a dead rank never joins can
        // be abandoned at the deadline (as a send is).
        let send: &'static [f32] = Box::leak(mine.into_boxed_slice());
        let recv: &'static mut [f32] = Box::leak(vec![0f32; data.len()].into_boxed_slice());
        let (send_ptr, recv_ptr): (*const [f32], *mut [f32]) = (send, recv);
        let request =
            self.world
                .immediate_all_reduce_into(StaticScope, send, recv, SystemOperation::sum());
        let me = self.rank();
        self.finish(request, |s| {
            format!("rank {me}: a reduction over every rank did not complete within {s} s (a rank died or a link stalled)")
        })?;
        // SAFETY: the request completed, so MPI no longer reads or writes either buffer, and
        // these pointers are the only ways left to them.
        let (sent, got) = unsafe {
            (
                Box::from_raw(send_ptr as *mut [f32]),
                Box::from_raw(recv_ptr),
            )
        };
        drop(sent);
        data.copy_from_slice(&got);
        Ok(())
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let mut all = vec![0u64; self.size()];
        self.world.all_gather_into(&value, &mut all[..]);
        Ok(all)
    }
}

/// An error unless `status` (of a receive from rank `from`) counts `expected` values.
fn expect_count(from: usize, status: &Status, expected: usize) -> Result<()> {
    let got = status.count(f32::equivalent_datatype()) as usize;
    ensure!(
        got == expected,
        "rank {from} sent {got} values where {expected} were expected"
    );
    Ok(())
}

/// The MPI world shared by threads: every call takes a lock, so MPI sees one call at a time,
/// as the serialized threading [`MpiWorld::init`] asks for allows from any thread.
pub struct SharedMpiWorld(std::sync::Mutex<MpiWorld>);

// SAFETY: MPI was initialized with `Threading::Serialized` (checked in `MpiWorld::init`), which
// allows calls from any thread as long as no two overlap; the mutex makes every call to the
// communicator exclusive. The communicator handle itself is only an id MPI resolves per call.
unsafe impl Send for SharedMpiWorld {}
unsafe impl Sync for SharedMpiWorld {}

impl SharedMpiWorld {
    pub fn new(world: MpiWorld) -> Self {
        Self(std::sync::Mutex::new(world))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MpiWorld> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collective for SharedMpiWorld {
    fn rank(&self) -> usize {
        self.lock().rank()
    }

    fn size(&self) -> usize {
        self.lock().size()
    }

    fn send(&self, to: usize, data: &[f32]) -> Result<()> {
        self.lock().send(to, data)
    }

    fn receive(&self, from: usize, data: &mut [f32]) -> Result<()> {
        self.lock().receive(from, data)
    }

    fn receive_waiting(&self, from: usize, data: &mut [f32]) -> Result<()> {
        self.lock().receive_waiting(from, data)
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        self.lock().all_reduce_sum(data)
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        self.lock().all_gather_u64(value)
    }
}
