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

/// The products of `call` (see [`Products`]).
pub(crate) fn products(m: &AffineTensor, call: &Products) -> Result<Tensor> {
    match call.kind {
        ProductKind::Plain => plain_products(m, call),
        ProductKind::Swiglu => swiglu_products(m, call),
    }
}

fn plain_products(m: &AffineTensor, call: &Products) -> Result<Tensor> {
    let (x, ids, x_div, out_rows) = (call.x, call.ids, call.x_div, call.out_rows);
    let xs = f32_values(x)?;
    let ids: Option<Vec<u32>> = ids.map(|t| t.to_vec1::<u32>()).transpose()?;
    let (scales, biases) = (f32_values(&m.scales)?, f32_values(&m.biases)?);
    let y = with_words(&m.packed, |words| -> Result<Vec<f32>> {
        let mut y = vec![0f32; out_rows * m.rows];
        for (i, out) in y.chunks_exact_mut(m.rows).enumerate() {
            let e = ids.as_ref().map_or(0, |ids| ids[i] as usize);
            ensure!(
                e < m.experts,
                "expert id {e} out of range ({} experts)",
                m.experts
            );
            let xr = &xs[(i / x_div) * m.cols..(i / x_div + 1) * m.cols];
            for (r, o) in out.iter_mut().enumerate() {
                let w = cpu_row(m, words, &scales, &biases, e * m.rows + r);
                *o = w.iter().zip(xr).map(|(w, x)| w * x).sum();
            }
        }
        Ok(y)
    })??;
    Ok(Tensor::from_vec(y, (out_rows, m.rows), x.device())?.to_dtype(x.dtype())?)
}

/// SwiGLU activations of a stacked gate-and-up matrix (`m.rows = 2·Im`): `g` and `u`
/// rounded to x's dtype, then `silu(g)·u` in f32, rounded once.
fn swiglu_products(m: &AffineTensor, call: &Products) -> Result<Tensor> {
    let (x, ids, x_div, out_rows) = (call.x, call.ids, call.x_div, call.out_rows);
    let dtype = x.dtype();
    let round = |v: f32| round_to(dtype, v);
    let xs = f32_values(x)?;
    let ids: Option<Vec<u32>> = ids.map(|t| t.to_vec1::<u32>()).transpose()?;
    let (scales, biases) = (f32_values(&m.scales)?, f32_values(&m.biases)?);
    let im = call.width(m);
    let act = with_words(&m.packed, |words| -> Result<Vec<f32>> {
        let mut act = vec![0f32; out_rows * im];
        for (i, out) in act.chunks_exact_mut(im).enumerate() {
            let e = ids.as_ref().map_or(0, |ids| ids[i] as usize);
            ensure!(
                e < m.experts,
                "expert id {e} out of range ({} experts)",
                m.experts
            );
            let xr = &xs[(i / x_div) * m.cols..(i / x_div + 1) * m.cols];
            let dot = |row: usize| -> f32 {
                let w = cpu_row(m, words, &scales, &biases, row);
                w.iter().zip(xr).map(|(w, x)| w * x).sum()
            };
            for (a, o) in out.iter_mut().enumerate() {
                let g = round(dot(e * m.rows + a));
                let u = round(dot(e * m.rows + im + a));
                *o = round(g / (1.0 + (-g).exp()) * u);
            }
        }
        Ok(act)
    })??;
    Ok(Tensor::from_vec(act, (out_rows, im), x.device())?.to_dtype(dtype)?)
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
