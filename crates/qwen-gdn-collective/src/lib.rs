//! Collectives between ranks, each owning one device, on an existing distributed engine
//! (issue 31 forbids a home-made transport): the [`Collective`] trait, its MPI implementation
//! behind the `mpi` feature and its NCCL one (with the one-host launcher of CUDA ranks) behind
//! the `nccl` feature, the agreement check ranks run before work, and the rule that splits
//! layers into pipeline stages.

mod agreement;
mod collective;
mod launched_children;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod launcher_stop;
mod layer_split;
#[cfg(feature = "mpi")]
mod mpi_world;
#[cfg(feature = "nccl")]
mod nccl_world;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod poll_pause;
mod rank_env;
mod rank_gpus;
#[cfg(feature = "nccl")]
mod rank_launch;

pub use agreement::{ensure_same_fingerprint, fnv1a};
pub use collective::{Collective, World};
pub use launched_children::forward_sigterm_to;
pub use layer_split::{split_experts, split_heads, split_layers, Stage};
#[cfg(feature = "mpi")]
pub use mpi_world::{MpiWorld, SharedMpiWorld};
#[cfg(feature = "nccl")]
pub use nccl_world::NcclWorld;
pub use rank_env::{NcclRankEnv, NCCL_ID_VAR, RANKS_VAR, RANK_VAR};
pub use rank_gpus::rank_gpus;
#[cfg(feature = "nccl")]
pub use rank_launch::run_nccl_job;

/// Call before printing this process's own last line (an error) and exiting: a launcher's
/// SIGTERM arriving after it then adds no second line (see `MpiWorld::launched`; without the
/// `mpi` or `nccl` feature, nothing to do).
pub fn ending_with_own_line() {
    #[cfg(any(feature = "mpi", feature = "nccl"))]
    launcher_stop::mute();
}
