//! The CPU twin of the greedy pick kernels: one pass over each row in index order. A value
//! replaces the best only when strictly greater, so the first of equal values stays, as the
//! kernels' (value, lower index) order gives whatever the slicing.

use super::GreedyPickParams;
use anyhow::Result;
use candle_core::{DType, Tensor};

pub(crate) fn greedy_pick(logits: &Tensor, p: &GreedyPickParams) -> Result<Tensor> {
    let values = logits
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let mut out = Vec::with_capacity(2 * p.rows as usize);
    for row in values.chunks_exact(p.vocab as usize) {
        out.extend(pick_row(row));
    }
    Ok(Tensor::from_vec(
        out,
        (p.rows as usize, 2),
        logits.device(),
    )?)
}

/// `[index, non-finite count]` of one row (index 0 when no value is finite).
fn pick_row(row: &[f32]) -> [u32; 2] {
    let (mut best, mut index, mut nonfinite) = (f32::NEG_INFINITY, None, 0u32);
    for (i, &x) in row.iter().enumerate() {
        if !x.is_finite() {
            nonfinite += 1;
        } else if index.is_none() || x > best {
            best = x;
            index = Some(i as u32);
        }
    }
    [index.unwrap_or(0), nonfinite]
}
