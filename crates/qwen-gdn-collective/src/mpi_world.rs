//! [`Collective`] on MPI (Open MPI here, Homebrew's on a Mac) through rsmpi.

use crate::Collective;
use anyhow::{anyhow, ensure, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Destination, Source};
use mpi::Rank;

/// The MPI world of this process. MPI allows one initialization per process, so there is one
/// `MpiWorld` per process; dropping it finalizes MPI.
pub struct MpiWorld {
    // Declared before the universe: the communicator must go before MPI is finalized.
    world: SimpleCommunicator,
    _universe: mpi::environment::Universe,
}

impl MpiWorld {
    /// Initializes MPI. Outside `mpirun` this is a world of one rank.
    pub fn init() -> Result<Self> {
        let universe = mpi::initialize()
            .ok_or_else(|| anyhow!("MPI was already initialized in this process"))?;
        Ok(Self {
            world: universe.world(),
            _universe: universe,
        })
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
        self.world.process_at_rank(self.peer(to)?).send(data);
        Ok(())
    }

    fn receive(&self, from: usize, data: &mut [f32]) -> Result<()> {
        let status = self
            .world
            .process_at_rank(self.peer(from)?)
            .receive_into(data);
        let got = status.count(f32::equivalent_datatype()) as usize;
        ensure!(
            got == data.len(),
            "rank {from} sent {got} values where {} were expected",
            data.len()
        );
        Ok(())
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let mine = data.to_vec();
        self.world
            .all_reduce_into(&mine[..], data, SystemOperation::sum());
        Ok(())
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let mut all = vec![0u64; self.size()];
        self.world.all_gather_into(&value, &mut all[..]);
        Ok(all)
    }
}
