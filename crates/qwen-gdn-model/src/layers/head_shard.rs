//! One rank's share of a mixer's heads under tensor parallel (issue 31): the output heads
//! `heads` of the `total` (a GDN layer's value heads, an attention layer's query heads), each
//! with the key heads it reads (the GDN's key heads, attention's KV heads).
//!
//! Which key heads a rank holds: when its share covers whole groups (a key head's `ratio`
//! output heads), the groups' own key heads, as one process holds them; otherwise one key
//! head per output head (a key head two ranks both need is held by both, and one a rank
//! needs for two of its heads twice), so that output head `i` of the rank reads key head `i`
//! and the kernels' `head / ratio` rule holds on every rank. Each rank computes its heads
//! exactly as one process computes them: projections are row by row, and the conv, the norms,
//! the recurrence and attention are per head.
//!
//! How the ranks combine: each rank writes its heads' outputs into their place of the whole
//! `[tokens, total · width]` row, zero elsewhere, and one sum over the ranks gives every rank
//! the whole row exactly (each value written by one rank, and `x + 0 = x`); every rank then
//! runs the whole output projection. So the mixer's output is bit for bit one process's
//! (`tests/tensor_mpi.rs`). The price against a reduction after a column-split output
//! projection: the output projection's bytes on every rank (a small share of a layer's), and
//! a sum of `total · width` values a token rather than `hidden`.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use qwen_gdn_collective::World;
use std::ops::Range;

/// This rank's heads of one mixer and the ranks it exchanges with.
#[derive(Clone)]
pub struct HeadShard {
    /// The global output heads this rank computes.
    pub heads: Range<usize>,
    /// Output heads of the whole mixer.
    pub total: usize,
    pub world: World,
}

impl std::fmt::Debug for HeadShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadShard")
            .field("heads", &self.heads)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl HeadShard {
    /// The key heads the share reads, in the order its kernels index them (see the module
    /// doc), for a mixer with `ratio` output heads a key head.
    pub fn key_heads(&self, ratio: usize) -> Vec<usize> {
        let whole_groups =
            self.heads.start.is_multiple_of(ratio) && self.heads.end.is_multiple_of(ratio);
        match whole_groups {
            true => (self.heads.start / ratio..self.heads.end / ratio).collect(),
            false => self.heads.clone().map(|h| h / ratio).collect(),
        }
    }

    /// Every rank's head outputs: `local` `[..., heads · width]` → `[..., total · width]` (in
    /// `local`'s dtype), the same on every rank, by one sum over the ranks.
    pub fn gather(&self, local: &Tensor) -> Result<Tensor> {
        let mine = self.heads.len();
        let last = *local.dims().last().unwrap_or(&0);
        ensure!(
            mine > 0 && last.is_multiple_of(mine),
            "tensor parallel: {last} output values for {mine} heads"
        );
        let width = last / mine;
        let values = local
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let row = self.total * width;
        let mut whole = vec![0f32; values.len() / last * row];
        for (out, own) in whole.chunks_exact_mut(row).zip(values.chunks_exact(last)) {
            out[self.heads.start * width..self.heads.end * width].copy_from_slice(own);
        }
        self.world.all_reduce_sum(&mut whole)?;
        let mut dims = local.dims().to_vec();
        *dims.last_mut().expect("checked") = row;
        Ok(Tensor::from_vec(whole, dims, local.device())?.to_dtype(local.dtype())?)
    }
}

/// The rows (or channels) of `heads`, each `width` wide, in a block starting at `at`: a
/// sharded mixer's projection rows of its heads, in the heads' order.
pub fn head_rows(heads: &[usize], width: usize, at: usize) -> Vec<usize> {
    heads
        .iter()
        .flat_map(|&h| at + h * width..at + (h + 1) * width)
        .collect()
}

/// A mixer's head outputs as its output projection reads them: `local` itself, or under
/// tensor parallel (`shard`) every rank's heads gathered ([`HeadShard::gather`]).
pub fn all_heads(shard: Option<&HeadShard>, local: &Tensor) -> Result<Tensor> {
    match shard {
        Some(shard) => shard.gather(local),
        None => Ok(local.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwen_gdn_collective::Collective;
    use std::sync::Arc;

    /// One rank alone: the sum over the ranks is its own buffer.
    struct Alone;
    impl Collective for Alone {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            1
        }
        fn send(&self, _: usize, _: &[f32]) -> Result<()> {
            unreachable!()
        }
        fn receive(&self, _: usize, _: &mut [f32]) -> Result<()> {
            unreachable!()
        }
        fn all_reduce_sum(&self, _: &mut [f32]) -> Result<()> {
            Ok(())
        }
        fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
            Ok(vec![value])
        }
    }

    fn shard(heads: Range<usize>, total: usize) -> HeadShard {
        HeadShard {
            heads,
            total,
            world: Arc::new(Alone),
        }
    }

    #[test]
    fn whole_groups_keep_their_key_heads_and_split_groups_get_one_each() {
        // 4 output heads, 2 a key head: [0, 1] is key head 0's whole group.
        assert_eq!(shard(0..2, 4).key_heads(2), vec![0]);
        assert_eq!(shard(2..4, 4).key_heads(2), vec![1]);
        assert_eq!(shard(0..4, 4).key_heads(2), vec![0, 1]);
        // Three ranks over 4 heads: 0..2, 2..3, 3..4: the last two share key head 1.
        assert_eq!(shard(2..3, 4).key_heads(2), vec![1]);
        assert_eq!(shard(3..4, 4).key_heads(2), vec![1]);
        // A share across a group boundary: one key head per output head.
        assert_eq!(shard(3..6, 8).key_heads(4), vec![0, 1, 1]);
    }

    #[test]
    fn gather_puts_the_heads_in_their_place() {
        let local = Tensor::new(
            &[[1f32, 2., 3., 4.], [5., 6., 7., 8.]],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        // Heads 1..3 of 4, two values a head.
        let whole = shard(1..3, 4).gather(&local).unwrap();
        assert_eq!(
            whole.to_vec2::<f32>().unwrap(),
            vec![
                vec![0., 0., 1., 2., 3., 4., 0., 0.],
                vec![0., 0., 5., 6., 7., 8., 0., 0.]
            ]
        );
    }
}
