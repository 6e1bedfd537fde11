//! The CPU twin of `kernels/attn_prep.{metal,cu}`: head by head in f32, rounding where the
//! kernels round, and the KV rows written in place.

use super::{AttnPrepDims, Inputs};
use crate::backend::{f32_values, round_to};
use crate::ops::add_rms_norm::cpu::rms_scale;
use anyhow::Result;
use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Tensor};
use half::{bf16, f16};

/// RMSNorm of one head, rounded to `dtype` (the composed path stores it), then partial RoPE
/// at `pos` in f32 (not yet rounded).
pub(crate) fn norm_rope(
    x: &[f32],
    w: &[f32],
    eps: f32,
    inv_freq: &[f32],
    pos: u32,
    dtype: DType,
) -> Vec<f32> {
    let inv = rms_scale(x, eps);
    let n: Vec<f32> = x
        .iter()
        .zip(w)
        .map(|(&x, &w)| round_to(dtype, x * inv * w))
        .collect();
    let half = inv_freq.len();
    let mut out = n.clone();
    for (i, &f) in inv_freq.iter().enumerate() {
        let angle = pos as f32 * f;
        let (sin, cos) = angle.sin_cos();
        let (x1, x2) = (n[i], n[i + half]);
        out[i] = x1 * cos - x2 * sin;
        out[i + half] = x2 * cos + x1 * sin;
    }
    out
}

pub(crate) fn attn_prep(d: AttnPrepDims, inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    let (dtype, eps) = (inputs.qkv.dtype(), inputs.eps);
    let (nq, nkv, dh) = (d.q_heads, d.kv_heads, d.head_dim);
    let x = f32_values(inputs.qkv)?;
    let (wq, wk) = (f32_values(inputs.q_norm)?, f32_values(inputs.k_norm)?);
    let inv_freq = f32_values(inputs.inv_freq)?;
    let pos = inputs.pos.to_vec1::<u32>()?[0];
    let width = (2 * nq + 2 * nkv) * dh;
    let (mut q, mut gate) = (Vec::with_capacity(d.batch * nq * dh), vec![]);
    let (mut k_rows, mut v_rows) = (vec![], vec![]);
    for row in x.chunks_exact(width) {
        for h in 0..nq {
            let head = &row[2 * h * dh..2 * (h + 1) * dh];
            q.extend(norm_rope(&head[..dh], &wq, eps, &inv_freq, pos, dtype));
            gate.extend_from_slice(&head[dh..]);
        }
        for h in 0..nkv {
            let at = (2 * nq + h) * dh;
            k_rows.extend(norm_rope(
                &row[at..at + dh],
                &wk,
                eps,
                &inv_freq,
                pos,
                dtype,
            ));
            let at = (2 * nq + nkv + h) * dh;
            v_rows.extend_from_slice(&row[at..at + dh]);
        }
    }
    if (pos as usize) < d.capacity {
        inputs.keys.inplace_op1(&WriteRows {
            dims: d,
            pos,
            rows: k_rows,
        })?;
        inputs.values.inplace_op1(&WriteRows {
            dims: d,
            pos,
            rows: v_rows,
        })?;
    }
    let dev = inputs.qkv.device();
    Ok((
        Tensor::from_vec(q, (d.batch, nq, dh), dev)?.to_dtype(dtype)?,
        Tensor::from_vec(gate, (d.batch, nq * dh), dev)?.to_dtype(dtype)?,
    ))
}

/// Writes `rows` `[B, Nkv, Dh]` at position `pos` of a `[B, Nkv, cap, Dh]` buffer.
struct WriteRows {
    dims: AttnPrepDims,
    pos: u32,
    rows: Vec<f32>,
}

impl WriteRows {
    fn write<T: Copy>(&self, buf: &mut [T], from: impl Fn(f32) -> T) {
        let (dh, cap) = (self.dims.head_dim, self.dims.capacity);
        for (n, row) in self.rows.chunks_exact(dh).enumerate() {
            let at = (n * cap + self.pos as usize) * dh;
            for (d, &s) in buf[at..at + dh].iter_mut().zip(row) {
                *d = from(s);
            }
        }
    }
}

impl InplaceOp1 for WriteRows {
    fn name(&self) -> &'static str {
        "attn-prep-kv-write"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("attn_prep: the KV buffers must be contiguous")
        };
        match storage {
            CpuStorage::F32(b) => self.write(&mut b[start..end], |x| x),
            CpuStorage::F16(b) => self.write(&mut b[start..end], f16::from_f32),
            CpuStorage::BF16(b) => self.write(&mut b[start..end], bf16::from_f32),
            _ => candle_core::bail!("attn_prep: KV buffers must be f32, f16 or bf16"),
        }
        Ok(())
    }
}
