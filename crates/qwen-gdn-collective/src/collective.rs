//! The operations the parallel plans need from the engine underneath.

use anyhow::Result;

/// One rank's view of the job: `size()` ranks numbered from 0, each owning one device.
///
/// Buffers are host `f32` slices: the pipeline plan sends one activation `[S, H]` per stage
/// boundary and step, which is small next to a layer's work. The NCCL implementation
/// (`nccl_world.rs`) stages them through its GPU; plans that keep activations on the device
/// would take device buffers, with calls of the same shape (peer, count, sum).
pub trait Collective {
    /// This rank's number, `0..size()`.
    fn rank(&self) -> usize;
    /// How many ranks the job has.
    fn size(&self) -> usize;
    /// Sends `data` to rank `to` (blocks until the buffer may be reused).
    fn send(&self, to: usize, data: &[f32]) -> Result<()>;
    /// Receives exactly `data.len()` values from rank `from` into `data`.
    fn receive(&self, from: usize, data: &mut [f32]) -> Result<()>;
    /// [`Collective::receive`] with no deadline, for a rank that waits on a person rather than
    /// on another rank's work (`chat --ranks`: the next message typed on rank 0). A rank that
    /// dies meanwhile still ends the job: the launcher stops every rank.
    fn receive_waiting(&self, from: usize, data: &mut [f32]) -> Result<()> {
        self.receive(from, data)
    }
    /// Element-wise sum of `data` over all ranks, left in `data` on every rank.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()>;
    /// Every rank's `value`, in rank order, on every rank.
    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>>;
}

/// A job's world as every plan holds it: shared between the plan, the model's layers (an
/// expert-parallel MoE block exchanges from inside the forward pass, on the CPU pool's
/// threads) and the generation loop.
pub type World = std::sync::Arc<dyn Collective + Send + Sync>;
