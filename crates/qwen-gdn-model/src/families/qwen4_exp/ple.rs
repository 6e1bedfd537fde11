//! The per-layer embedding (PLE) of `qwen4_exp` (docs/qwen4_exp.md §4.2): hashed n-gram rows
//! gathered from the mapped tables, projected to a value and one key per residual stream, a
//! per-stream sigmoid gate from the normalised streams, and a dilated depthwise conv over
//! the normalised gated values. The result is added to the streams before the layer's
//! attention hyper-connection. Composed candle ops (f32 on the reference plan); the hash and
//! the gather run on the host.

use super::hyper_connection::GroupedRmsNorm;
use super::ngram_hash::NgramHash;
use super::ngram_tables::{NgramTable, RowTable};
use crate::candle_ops::{sigmoid, silu};
use crate::layers::linear::Linear;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::{anyhow, ensure, Result};
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::candle_op;

/// What a PLE layer carries from one call to the next.
#[derive(Debug, Clone)]
pub struct PleState {
    /// The last `ngram_size − 1` token ids (eos at the start).
    pub context: Vec<u32>,
    /// The last `(kernel − 1) · dilation` normalised gated values `[rows, S·H]` (zeros at the
    /// start).
    pub window: Tensor,
}

impl PleState {
    /// A copy sharing no storage with `self` (snapshots and [`crate::Cache::deep_clone`]).
    pub fn deep_clone(&self) -> Result<Self> {
        Ok(Self {
            context: self.context.clone(),
            window: crate::tensor::own_copy(&self.window)?,
        })
    }

    /// Bytes held (the window and the ids).
    pub fn bytes(&self) -> u64 {
        (self.window.elem_count() * self.window.dtype().size_in_bytes() + 4 * self.context.len())
            as u64
    }
}

#[derive(Debug)]
pub struct PerLayerEmbedding {
    pub hash: NgramHash,
    pub table: RowTable,
    pub key_proj: Linear,
    pub value_proj: Linear,
    pub norm_key: GroupedRmsNorm,
    pub norm_query: GroupedRmsNorm,
    pub norm_conv: GroupedRmsNorm,
    /// `[S·H, kernel]`.
    pub conv: Tensor,
    pub dilation: usize,
    pub streams: usize,
    pub hidden: usize,
}

impl PerLayerEmbedding {
    /// The PLE block of decoder layer `table.layer`.
    pub fn load(ckpt: &Checkpoint, table: &NgramTable, config: &Config) -> Result<Self> {
        let q = config
            .qwen4_exp
            .as_ref()
            .ok_or_else(|| anyhow!("per-layer embeddings need a qwen4_exp config"))?;
        let ple = q
            .ple
            .as_ref()
            .ok_or_else(|| anyhow!("the config has no ple_layer_ids"))?;
        let layer = table.layer;
        let p = ple
            .index_of(layer)
            .ok_or_else(|| anyhow!("layer {layer} has no per-layer embedding"))?;
        let (s, h, e) = (q.hc_count, config.hidden_size, ple.embed_dim);
        let eps = config.rms_norm_eps;
        let m = format!("model.layers.{layer}.ple");
        let norm = |n: &str| GroupedRmsNorm::load(ckpt, &format!("{m}.{n}.weight"), s, h, eps);
        Ok(Self {
            hash: NgramHash::new(ple, p, config.vocab_size),
            table: table.open(ckpt, ple.row_width())?,
            key_proj: Linear::load(ckpt, &format!("{m}.key_proj"), s * h, e, config)?,
            value_proj: Linear::load(ckpt, &format!("{m}.value_proj"), h, e, config)?,
            norm_key: norm("norm_key")?,
            norm_query: norm("norm_query")?,
            norm_conv: norm("norm_conv")?,
            conv: ckpt.conv1d(
                &format!("{m}.conv1d.weight"),
                s * h,
                ple.conv_kernel,
                &Device::Cpu,
            )?,
            dilation: ple.ngram_size,
            streams: s,
            hidden: h,
        })
    }

    /// The device plan's copy: projections on `device` in `dtype`; norms and conv weights
    /// in f32 there. The table stays mapped on the host.
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            key_proj: self.key_proj.into_device(device, dtype)?,
            value_proj: self.value_proj.into_device(device, dtype)?,
            norm_key: self.norm_key.into_device(device)?,
            norm_query: self.norm_query.into_device(device)?,
            norm_conv: self.norm_conv.into_device(device)?,
            conv: self.conv.to_device(device)?,
            ..self
        })
    }

    /// The state of a new sequence.
    pub fn new_state(&self) -> Result<PleState> {
        let (c, k) = self.conv.dims2()?;
        Ok(PleState {
            context: self.hash.initial_context(),
            window: Tensor::zeros(((k - 1) * self.dilation, c), DType::F32, &Device::Cpu)?,
        })
    }

    /// The term added to the streams `hs` `[T, S·H]` for `tokens` (T of them); advances
    /// `state`.
    pub fn forward(&self, hs: &Tensor, tokens: &[u32], state: &mut PleState) -> Result<Tensor> {
        let t = tokens.len();
        ensure!(hs.dim(0)? == t, "PLE: {} rows for {t} tokens", hs.dim(0)?);
        let (rows, context) = self.rows(&state.context, tokens)?;
        let emb =
            Tensor::from_vec(rows, (t, self.row_width()), &Device::Cpu)?.to_device(hs.device())?;
        let out = self.forward_rows(hs, &emb, state, false)?;
        state.context = context;
        Ok(out)
    }

    /// Elements of one token's gathered rows (every hash head's row).
    pub fn row_width(&self) -> usize {
        self.table.width * self.hash.heads()
    }

    /// The host part of [`Self::forward`]: the gathered rows of `tokens` after `context`,
    /// `[T, row_width]` row-major f32 (per token the concatenation of its heads' rows), and
    /// the context after them.
    pub fn rows(&self, context: &[u32], tokens: &[u32]) -> Result<(Vec<f32>, Vec<u32>)> {
        let (ids, context) = self.hash.ids(context, tokens);
        Ok((self.table.gather(&ids)?, context))
    }

    /// The device part of [`Self::forward`] on the gathered rows `emb` `[T, row_width]` (f32,
    /// on `hs`'s device): advances the conv window, not the n-gram context (the caller's,
    /// who gathered the rows). With `in_place` a window already on `hs`'s device is
    /// rewritten in place (its tensor kept: a CUDA graph's step bakes in its address).
    pub fn forward_rows(
        &self,
        hs: &Tensor,
        emb: &Tensor,
        state: &mut PleState,
        in_place: bool,
    ) -> Result<Tensor> {
        let t = hs.dim(0)?;
        let emb = emb.to_dtype(hs.dtype())?;
        let (s, h) = (self.streams, self.hidden);
        let keys = self.norm_key.forward(&self.key_proj.forward(&emb)?)?;
        let value = self.value_proj.forward(&emb)?;
        let queries = self.norm_query.forward(hs)?;
        // Per stream: a signed square root of the scaled key·query product, then a sigmoid.
        let dot = candle_op(candle_op(keys.mul(&queries))?.reshape((t, s, h)))?;
        let g = candle_op(candle_op(dot.sum_keepdim(D::Minus1))? / (h as f64).sqrt())?;
        let mag = candle_op(candle_op(candle_op(g.abs())?.maximum(1e-6))?.sqrt())?;
        let g = candle_op(mag.mul(&candle_op(g.sign())?))?;
        let gate = sigmoid(&g)?; // [T, S, 1]
        let gated = candle_op(gate.broadcast_mul(&candle_op(value.reshape((t, 1, h)))?))?;
        let gated = candle_op(gated.reshape((t, s * h)))?;
        let normed = self.norm_conv.forward(&gated)?;
        let conv = self.dilated_conv(&normed, state, in_place)?;
        candle_op(gated.add(&conv))
    }

    /// `silu(Σ_j w[:, j] · x[t − (K−1−j)·dilation])` with the state's window before `x`;
    /// the window advanced in place when `in_place` and it lives on `x`'s device.
    fn dilated_conv(&self, x: &Tensor, state: &mut PleState, in_place: bool) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (_, k) = self.conv.dims2()?;
        let keep = state.window.dim(0)?;
        // The window of a new sequence starts on the host; it lives on x's device after.
        let window = state.window.to_device(x.device())?.to_dtype(x.dtype())?;
        let padded = candle_op(Tensor::cat(&[&window, x], 0))?;
        let w = self.conv.to_dtype(x.dtype())?;
        let mut acc: Option<Tensor> = None;
        for j in 0..k {
            let tap = candle_op(padded.narrow(0, j * self.dilation, t))?;
            let wj = candle_op(candle_op(w.narrow(1, j, 1))?.reshape((1, w.dim(0)?)))?;
            let term = candle_op(tap.broadcast_mul(&wj))?;
            acc = Some(match acc {
                None => term,
                Some(a) => candle_op(a.add(&term))?,
            });
        }
        let next =
            candle_op(padded.narrow(0, padded.dim(0)? - keep, keep))?.to_dtype(DType::F32)?;
        if in_place && state.window.device().same_device(x.device()) {
            crate::candle_ops::write_at(&state.window, &next, 0, 0)?;
        } else {
            state.window = next;
        }
        let acc = acc.ok_or_else(|| anyhow!("PLE conv kernel is empty"))?;
        silu(&acc)
    }
}
