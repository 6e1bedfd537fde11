//! Collectives between ranks, each owning one device, on an existing distributed engine
//! (issue 31 forbids a home-made transport): the [`Collective`] trait, its MPI
//! implementation behind the `mpi` feature, the agreement check ranks run before work, and
//! the rule that splits layers into pipeline stages.

mod agreement;
mod collective;
#[cfg(feature = "mpi")]
mod launcher_stop;
mod layer_split;
#[cfg(feature = "mpi")]
mod mpi_world;

pub use agreement::{ensure_same_fingerprint, fnv1a};
pub use collective::{Collective, World};
pub use layer_split::{split_experts, split_heads, split_layers, Stage};
#[cfg(feature = "mpi")]
pub use mpi_world::{MpiWorld, SharedMpiWorld};

/// Call before printing this process's own last line (an error) and exiting: a launcher's
/// SIGTERM arriving after it then adds no second line (see
/// `MpiWorld::end_with_one_line_when_stopped`; without the `mpi` feature, nothing to do).
pub fn ending_with_own_line() {
    #[cfg(feature = "mpi")]
    launcher_stop::mute();
}
