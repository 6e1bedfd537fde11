//! The reference recurrence on the CPU: one pass over time per head, heads in parallel.
//!
//! Every row `S[b, hv, dv, :]` of the state evolves independently (its memory read uses
//! only itself), as a GPU lane's registers would hold it; a head's rows are walked together
//! so that they share each step's `q` and `k` loads.

use super::{GdnDims, Inputs};
use crate::backend::f32_values;
use anyhow::Result;
use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};
use half::bf16;
use rayon::prelude::*;
use std::sync::Mutex;

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    update_on_host(Recurrence, dims, inputs, state)
}

/// The inputs of one call as f32 host vectors: what every CPU form reads.
pub(super) struct HostInputs {
    pub(super) dims: GdnDims,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) g: Vec<f32>,
    pub(super) beta: Vec<f32>,
    /// `[B, T]`, 0 where a token is padding.
    pub(super) mask: Option<Vec<f32>>,
}

/// A CPU form of the update (the recurrence, or the chunked form of `cpu_chunked.rs`).
pub(super) trait HostForm: Sync {
    const NAME: &'static str;
    /// Advances `state` (`[B, Hv, Dv, Dk]` in its storage dtype) in place over the call's
    /// tokens; returns y per value head, `[B, Hv, T, Dv]`.
    fn run<S: StateElem>(&self, x: &HostInputs, state: &mut [S]) -> Vec<f32>;
}

/// Runs `form` on the state in place; y as `[B, T, Hv, Dv]` in q's dtype.
pub(super) fn update_on_host<F: HostForm>(
    form: F,
    dims: GdnDims,
    inputs: &Inputs,
    state: &Tensor,
) -> Result<Tensor> {
    let Inputs {
        q,
        k,
        v,
        g,
        beta,
        mask,
    } = *inputs;
    let op = OnState {
        form,
        x: HostInputs {
            mask: mask.map(f32_values).transpose()?,
            dims,
            q: f32_values(q)?,
            k: f32_values(k)?,
            v: f32_values(v)?,
            g: f32_values(g)?,
            beta: f32_values(beta)?,
        },
        y_heads: Mutex::new(vec![]),
    };
    state.inplace_op1(&op)?;
    let y_heads = op
        .y_heads
        .into_inner()
        .expect("no other holder of the output lock");
    let shape = (dims.batch, dims.steps, dims.value_heads, dims.value_dim);
    Ok(
        Tensor::from_vec(heads_to_tokens(&dims, &y_heads), shape, q.device())?
            .to_dtype(q.dtype())?,
    )
}

/// A form bound to its inputs, as candle's in-place op on the state.
struct OnState<F> {
    form: F,
    x: HostInputs,
    /// Filled by the op: `y` as `[B, Hv, T, Dv]`.
    y_heads: Mutex<Vec<f32>>,
}

impl<F: HostForm> InplaceOp1 for OnState<F> {
    fn name(&self) -> &'static str {
        F::NAME
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("gated_delta_update: the state must be contiguous")
        };
        let y_heads = match storage {
            CpuStorage::F32(data) => self.form.run(&self.x, &mut data[start..end]),
            CpuStorage::BF16(data) => self.form.run(&self.x, &mut data[start..end]),
            _ => candle_core::bail!("gated_delta_update: the state must be f32 or bf16"),
        };
        *self.y_heads.lock().expect("output lock") = y_heads;
        Ok(())
    }
}

/// `[B, Hv, T, Dv]` (each head's outputs together, as the forms write them) to the op's
/// `[B, T, Hv, Dv]`.
fn heads_to_tokens(d: &GdnDims, y_heads: &[f32]) -> Vec<f32> {
    let (t_len, hv_n, dv) = (d.steps, d.value_heads, d.value_dim);
    let mut y = vec![0f32; y_heads.len()];
    if y_heads.is_empty() {
        return y;
    }
    for (head, ys) in y_heads.chunks_exact(t_len * dv).enumerate() {
        let (b, hv) = (head / hv_n, head % hv_n);
        for (t, y_t) in ys.chunks_exact(dv).enumerate() {
            let at = ((b * t_len + t) * hv_n + hv) * dv;
            y[at..at + dv].copy_from_slice(y_t);
        }
    }
    y
}

/// The token-by-token recurrence.
struct Recurrence;

/// How the state is stored between calls.
pub(super) trait StateElem: Copy + Send + Sync {
    fn load(self) -> f32;
    fn store(x: f32) -> Self;
}

impl StateElem for f32 {
    fn load(self) -> f32 {
        self
    }
    fn store(x: f32) -> Self {
        x
    }
}

impl StateElem for bf16 {
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl HostForm for Recurrence {
    const NAME: &'static str = "gated-delta-update";

    /// One task per (batch, value head): its `Dv × Dk` state (64 KiB at Qwen3-Next's
    /// shapes) stays in cache while the steps go by, and each step's `q` and `k` are read
    /// once for all of its rows. Within a row the arithmetic is the row-by-row recurrence's.
    fn run<S: StateElem>(&self, x: &HostInputs, state: &mut [S]) -> Vec<f32> {
        let d = x.dims;
        let (t_len, dk, dv, hv_n) = (d.steps, d.key_dim, d.value_dim, d.value_heads);
        let group = d.value_heads / d.key_heads;
        // Per-head outputs `[T, Dv]`, scattered into `[B, T, Hv, Dv]` afterwards.
        let mut y_heads = vec![0f32; state.len() / dk * t_len];
        state
            .par_chunks_mut(dv * dk)
            .zip(y_heads.par_chunks_mut((t_len * dv).max(1)))
            .enumerate()
            .for_each(|(head, (s_head, y))| {
                let (b, hv) = (head / hv_n, head % hv_n);
                let hk = hv / group;
                let mut s: Vec<f32> = s_head.iter().map(|x| x.load()).collect();
                for t in 0..t_len {
                    let y_t = &mut y[t * dv..(t + 1) * dv];
                    if x.mask.as_ref().is_some_and(|m| m[b * t_len + t] == 0.0) {
                        y_t.fill(0.0);
                        continue;
                    }
                    let qk_at = ((b * t_len + t) * d.key_heads + hk) * dk;
                    let (q, k) = (&x.q[qk_at..qk_at + dk], &x.k[qk_at..qk_at + dk]);
                    let gate_at = (b * t_len + t) * hv_n + hv;
                    let (g, beta) = (x.g[gate_at], x.beta[gate_at]);
                    let v = &x.v[gate_at * dv..(gate_at + 1) * dv];
                    step(&mut s, q, k, v, g, beta, y_t);
                }
                for (dst, x) in s_head.iter_mut().zip(&s) {
                    *dst = S::store(*x);
                }
            });
        y_heads
    }
}

crate::multiversion! {
    /// One time step of one head, row by row (`s` is `[Dv, Dk]`): decay and read the memory,
    /// correct it towards `v` by `β`, read it with `q`.
    fn step(
        s: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: f32,
        beta: f32,
        y: &mut [f32],
    ) -> () {
        for ((row, &v), y) in s.chunks_exact_mut(k.len()).zip(v).zip(y) {
            let delta = (v - decay_and_read(row, k, g)) * beta;
            *y = write_and_read(row, k, q, delta);
        }
    }
}

/// `s ← g·s`, returns `s·k`: decay and memory read in one pass over the row. Eight
/// independent accumulators let the compiler use SIMD lanes.
#[inline(always)]
fn decay_and_read(s: &mut [f32], k: &[f32], g: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut tail = 0f32;
    let mut sc = s.chunks_exact_mut(8);
    let mut kc = k.chunks_exact(8);
    for (sv, kv) in (&mut sc).zip(&mut kc) {
        for l in 0..8 {
            sv[l] *= g;
            acc[l] += sv[l] * kv[l];
        }
    }
    for (sv, kv) in sc.into_remainder().iter_mut().zip(kc.remainder()) {
        *sv *= g;
        tail += *sv * kv;
    }
    acc.iter().sum::<f32>() + tail
}

/// `s ← s + δ·k`, returns `s·q`.
#[inline(always)]
fn write_and_read(s: &mut [f32], k: &[f32], q: &[f32], delta: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut tail = 0f32;
    let mut sc = s.chunks_exact_mut(8);
    let (mut kc, mut qc) = (k.chunks_exact(8), q.chunks_exact(8));
    for ((sv, kv), qv) in (&mut sc).zip(&mut kc).zip(&mut qc) {
        for l in 0..8 {
            sv[l] += kv[l] * delta;
            acc[l] += sv[l] * qv[l];
        }
    }
    for ((sv, kv), qv) in sc
        .into_remainder()
        .iter_mut()
        .zip(kc.remainder())
        .zip(qc.remainder())
    {
        *sv += kv * delta;
        tail += *sv * qv;
    }
    acc.iter().sum::<f32>() + tail
}
