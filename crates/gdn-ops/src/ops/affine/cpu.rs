//! The CPU twin of the affine kernels: the same function, row by row in f32, so that the
//! device plan runs (and is tested) on any machine.

use super::packing::dequantize_row;
use super::{AffineTensor, ProductKind, Products};
use crate::backend::{f32_values, round_to};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Storage, Tensor};

/// Runs `f` on the packed words of a CPU tensor without copying them.
fn with_words<R>(t: &Tensor, f: impl FnOnce(&[u32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        bail!("expected a CPU tensor")
    };
    ensure!(layout.is_contiguous(), "packed weights must be contiguous");
    let words = cpu.as_slice::<u32>()?;
    Ok(f(
        &words[layout.start_offset()..layout.start_offset() + t.elem_count()]
    ))
}

/// Stacked row `row` of `m`, dequantized in f32.
fn cpu_row(
    m: &AffineTensor,
    words: &[u32],
    scales: &[f32],
    biases: &[f32],
    row: usize,
) -> Vec<f32> {
    let (wpr, gpr) = (m.cols * m.bits / 32, m.cols / m.group_size);
    let mut out = vec![0f32; m.cols];
    dequantize_row(
        &words[row * wpr..(row + 1) * wpr],
        &scales[row * gpr..(row + 1) * gpr],
        &biases[row * gpr..(row + 1) * gpr],
        m.bits,
        &mut out,
    );
    out
}

/// The products of `call` (see [`Products`]), row by row in f32, rounded once to x's dtype.
/// SwiGLU activations of a stacked gate-and-up matrix (`m.rows = 2·Im`) round `g` and `u`
/// to x's dtype, then `silu(g)·u` in f32.
pub(crate) fn products(m: &AffineTensor, call: &Products) -> Result<Tensor> {
    let (x, ids, x_div, out_rows) = (call.x, call.ids, call.x_div, call.out_rows);
    let dtype = x.dtype();
    let round = |v: f32| round_to(dtype, v);
    let xs = f32_values(x)?;
    let ids: Option<Vec<u32>> = ids.map(|t| t.to_vec1::<u32>()).transpose()?;
    let (scales, biases) = (f32_values(&m.scales)?, f32_values(&m.biases)?);
    let width = call.width(m);
    let y = with_words(&m.packed, |words| -> Result<Vec<f32>> {
        let mut y = vec![0f32; out_rows * width];
        for (i, out) in y.chunks_exact_mut(width).enumerate() {
            let e = ids.as_ref().map_or(0, |ids| ids[i] as usize);
            ensure!(
                e < m.experts,
                "expert id {e} out of range ({} experts)",
                m.experts
            );
            let xr = &xs[(i / x_div) * m.cols..(i / x_div + 1) * m.cols];
            // Row `r` of expert `e`'s matrix times x's row.
            let dot = |r: usize| -> f32 {
                let w = cpu_row(m, words, &scales, &biases, e * m.rows + r);
                w.iter().zip(xr).map(|(w, x)| w * x).sum()
            };
            for (r, o) in out.iter_mut().enumerate() {
                *o = match call.kind {
                    ProductKind::Plain => dot(r),
                    ProductKind::Swiglu => {
                        let g = round(dot(r));
                        let u = round(dot(width + r));
                        round(g / (1.0 + (-g).exp()) * u)
                    }
                };
            }
        }
        Ok(y)
    })??;
    Ok(Tensor::from_vec(y, (out_rows, width), x.device())?.to_dtype(dtype)?)
}

pub(crate) fn dequantize(
    m: &AffineTensor,
    ids: Option<&Tensor>,
    count: usize,
    dtype: DType,
) -> Result<Tensor> {
    let ids: Option<Vec<u32>> = ids.map(|t| t.to_vec1::<u32>()).transpose()?;
    let (scales, biases) = (f32_values(&m.scales)?, f32_values(&m.biases)?);
    let total = m.experts * m.rows;
    let out = with_words(&m.packed, |words| -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(count * m.cols);
        for i in 0..count {
            let row = ids.as_ref().map_or(i, |ids| ids[i] as usize);
            ensure!(
                row < total,
                "row {row} is outside the matrix ({total} rows)"
            );
            out.extend(cpu_row(m, words, &scales, &biases, row));
        }
        Ok(out)
    })??;
    let t = Tensor::from_vec(out, (count, m.cols), m.device())?;
    // One rounding from f32, as the kernel does.
    Ok(match dtype {
        DType::BF16 | DType::F16 | DType::F32 => t.to_dtype(dtype)?,
        other => bail!("affine dequantize: unsupported output dtype {other:?}"),
    })
}
