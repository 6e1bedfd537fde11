//! The CPU twin of the pooling kernels (the spec of the module doc, in the kernels' order:
//! the tail summed row by row, the squares summed per lane of a 32-lane warp and then by an
//! xor butterfly, each product and sum rounded on its own as `__fmul_rn`/`__fadd_rn` round).

use super::{IndexerPoolParams, PoolCall};
use crate::backend::f32_values as values;
use anyhow::Result;
use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};

/// Lanes of the kernels' warp (simdgroup).
const LANES: usize = 32;

fn first_u32(t: &Tensor) -> Result<usize> {
    Ok(t.flatten_all()?.narrow(0, 0, 1)?.to_vec1::<u32>()?[0] as usize)
}

/// Σ v² as the kernels add it: lane `l` sums `v[l], v[l + 32], …`, then lane `l` adds lane
/// `l ^ o`'s sum for o = 16, 8, 4, 2, 1 (every lane ends with lane 0's value).
pub(crate) fn warp_sum_of_squares(v: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (d, x) in v.iter().enumerate() {
        lanes[d % LANES] += x * x;
    }
    for o in [16, 8, 4, 2, 1] {
        let before = lanes;
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = before[l] + before[l ^ o];
        }
    }
    lanes[0]
}

/// The pooled, normalised and rotated key of a tail (`c` rows of `Di` values, row-major).
pub(crate) fn pooled_key(
    tail: &[f32],
    p: &IndexerPoolParams,
    cos: &[f32],
    sin: &[f32],
    norm: &[f32],
) -> Vec<f32> {
    let (di, c, h) = (p.dim as usize, p.rows as usize, p.rope_half as usize);
    let pooled: Vec<f32> = (0..di)
        .map(|d| (0..c).fold(0f32, |s, r| s + tail[r * di + d]) / c as f32)
        .collect();
    let inv = 1.0 / (warp_sum_of_squares(&pooled) / di as f32 + p.eps).sqrt();
    let v = |d: usize| pooled[d] * (inv * norm[d]);
    (0..di)
        .map(|d| {
            if d < h {
                v(d) * cos[d] - v(d + h) * sin[d]
            } else if d < 2 * h {
                v(d - h) * sin[d - h] + v(d) * cos[d - h]
            } else {
                v(d)
            }
        })
        .collect()
}

/// Writes `values` over row `row` of a contiguous f32 `[rows, values.len()]` tensor.
struct WriteRow<'a> {
    row: usize,
    values: &'a [f32],
}

impl InplaceOp1 for WriteRow<'_> {
    fn name(&self) -> &'static str {
        "indexer-pool-row"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, _)) = layout.contiguous_offsets() else {
            candle_core::bail!("indexer_pool: the buffers must be contiguous")
        };
        let CpuStorage::F32(s) = storage else {
            candle_core::bail!("indexer_pool: the buffers must be f32")
        };
        let at = start + self.row * self.values.len();
        s[at..at + self.values.len()].copy_from_slice(self.values);
        Ok(())
    }
}

pub(crate) fn indexer_pool(call: &PoolCall, p: &IndexerPoolParams) -> Result<()> {
    let (tail_row, block_row) = (first_u32(call.tail_row)?, first_u32(call.block_row)?);
    // As the kernels: a row past its buffer writes nothing.
    if tail_row >= p.rows as usize || block_row >= p.capacity as usize {
        return Ok(());
    }
    let di = p.dim as usize;
    let key = values(&call.qk.narrow(1, call.key_offset, di)?)?;
    let mut tail = values(call.tail)?;
    tail[tail_row * di..(tail_row + 1) * di].copy_from_slice(&key);
    let pooled = pooled_key(
        &tail,
        p,
        &values(call.cos)?,
        &values(call.sin)?,
        &values(call.norm)?,
    );
    call.tail.inplace_op1(&WriteRow {
        row: tail_row,
        values: &key,
    })?;
    call.blocks.inplace_op1(&WriteRow {
        row: block_row,
        values: &pooled,
    })?;
    Ok(())
}
