//! One rank's share of an MoE block under expert parallelism (issue 31): the experts
//! `experts` of the `total` of every MoE layer, the router and the shared expert replicated.
//!
//! Why replicated: the router is one `[E, H]` product whose result every rank needs to know
//! which of its experts a token chose, and the shared expert is a dense MLP that every token
//! runs; sharding either would add an exchange per layer for a small share of the bytes.
//!
//! How the ranks combine: every rank routes every token the same way (the same router, the
//! same input), runs its own experts' products on the tokens that chose them, and writes
//! each weighted result into that (token, slot) of a `[N, k, H]` f32 buffer, zero elsewhere.
//! The buffers are summed over the ranks; since each slot is written by exactly one rank and
//! `x + 0 = x`, the sum is every slot's value exactly, whatever order the reduction takes.
//! Each rank then adds a token's slots in ascending expert order, as one process adds them,
//! so the block's output is bit for bit one process's (`tests/experts_mpi.rs`). The price:
//! `k` times the bytes of a reduction of the `[N, H]` output per MoE layer, 80 KB a decode
//! step's layer at Qwen3-Next's k = 10 and H = 2048.

use anyhow::{ensure, Result};
use qwen_gdn_collective::World;
use std::ops::Range;

/// This rank's experts of an MoE block and the ranks it exchanges with.
#[derive(Clone)]
pub struct ExpertShard {
    /// The global ids of the experts this rank holds (its stacks hold these, in order).
    pub experts: Range<usize>,
    /// Experts per MoE block over all ranks.
    pub total: usize,
    pub world: World,
}

impl std::fmt::Debug for ExpertShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertShard")
            .field("experts", &self.experts)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl ExpertShard {
    /// The block's routed output `[N, H]` from `slots` (`[N, k, H]` f32, this rank's slots
    /// written, the others zero) and `experts_of` (each token's `k` experts, ascending, the
    /// slot order): every rank's slots gathered by one sum, then added per token in ascending
    /// expert order (see the module doc).
    pub fn combine(&self, mut slots: Vec<f32>, k: usize, h: usize) -> Result<Vec<f32>> {
        ensure!(
            slots.len().is_multiple_of(k * h),
            "expert slots of {} values for k = {k}, H = {h}",
            slots.len()
        );
        self.world.all_reduce_sum(&mut slots)?;
        let tokens = slots.len() / (k * h);
        let mut out = vec![0f32; tokens * h];
        for (t, row) in out.chunks_exact_mut(h).enumerate() {
            for slot in slots[t * k * h..(t + 1) * k * h].chunks_exact(h) {
                row.iter_mut().zip(slot).for_each(|(o, y)| *o += y);
            }
        }
        Ok(out)
    }
}
