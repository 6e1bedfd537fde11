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

pub use agreement::ensure_same_fingerprint;
pub use collective::Collective;
pub use layer_split::{split_layers, Stage};
#[cfg(feature = "mpi")]
pub use mpi_world::MpiWorld;
