//! Gated full attention (mlx-lm-reference.md §3.7): `q_proj` yields `[query | gate]` per
//! head, q/k get RMSNorm and partial RoPE, GQA softmax attention over the KV cache, and the
//! output is multiplied by `sigmoid(gate)` before `o_proj`.

use super::head_shard::{all_heads, head_rows, HeadShard};
use super::linear::{FusedLinear, Linear};
use super::norm::RmsNorm;
use super::rope::PartialRope;
use crate::cache::KvCache;
use crate::candle_ops::{cat, full, matmul, sigmoid, softmax_last_dim, zeros};
use crate::tensor::{cast, contiguous};
use crate::weights::Checkpoint;
use crate::weights::Weight;
use crate::Config;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::{candle_op, candle_ops};
use gdn_ops::profile::labelled;

mod blocked;
mod decode;
mod verify;

pub use blocked::{BlockPlan, SCORE_BUDGET_BYTES};

/// Where CUDA's prefill chunks compute their attention (`RunOptions::attn_prefill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnPrefill {
    /// `gdn_ops::ops::attn_prefill`'s kernel wherever it applies (the default).
    Kernel,
    /// The composed path, as on the other devices: to compare the two on a GPU.
    Composed,
}

#[derive(Debug, Clone)]
pub struct Attention {
    /// `[q_proj | k_proj | v_proj]`.
    qkv: FusedLinear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: PartialRope,
    /// Device plan: `[rope dims / 2]` f32 inverse frequencies, for the fused decode kernel.
    rope_inv_freq: Option<Tensor>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Set at load from the run's options ([`Attention::set_variants`]).
    prefill: AttnPrefill,
    /// Bytes of f32 scores one block of [`blocked`] attention may hold.
    score_budget: usize,
    /// Under tensor parallel: this rank's query heads (`heads`/`kv_heads` are then the
    /// rank's), gathered over the ranks before `o_proj` ([`Attention::shard_heads`]).
    shard: Option<HeadShard>,
}

impl Attention {
    pub fn load(ckpt: &Checkpoint, prefix: &str, cfg: &Config) -> Result<Self> {
        let (h, nq, nkv, dh) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let dev = &Device::Cpu;
        let eps = cfg.rms_norm_eps as f32;
        Ok(Self {
            qkv: FusedLinear::new(vec![
                Linear::load(ckpt, &format!("{prefix}.q_proj"), 2 * nq * dh, h, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.k_proj"), nkv * dh, h, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.v_proj"), nkv * dh, h, cfg)?,
            ]),
            o_proj: Linear::load(ckpt, &format!("{prefix}.o_proj"), h, nq * dh, cfg)?,
            q_norm: RmsNorm {
                weight: ckpt.norm(&format!("{prefix}.q_norm.weight"), dh, dev)?,
                eps,
            },
            k_norm: RmsNorm {
                weight: ckpt.norm(&format!("{prefix}.k_norm.weight"), dh, dev)?,
                eps,
            },
            rope: PartialRope::new(cfg.rope_dims(), cfg.rope_theta),
            rope_inv_freq: None,
            heads: nq,
            kv_heads: nkv,
            head_dim: dh,
            prefill: AttnPrefill::Kernel,
            score_budget: SCORE_BUDGET_BYTES,
            shard: None,
        })
    }

    /// Keeps only the query heads `shard.heads` and the KV heads they read
    /// ([`HeadShard::key_heads`]): the rows of the q (with each head's gate), k and v
    /// projections. The reference plan only (host weights).
    pub fn shard_heads(&mut self, shard: HeadShard) -> Result<()> {
        let (nq, nkv, dh) = (self.heads, self.kv_heads, self.head_dim);
        anyhow::ensure!(
            self.shard.is_none() && shard.total == nq && shard.heads.end <= nq,
            "tensor parallel: query heads {:?} of {} asked of an attention layer of {nq}",
            shard.heads,
            shard.total
        );
        let kv = shard.key_heads(nq / nkv);
        let queries: Vec<usize> = shard.heads.clone().collect();
        // q_proj holds `[query | gate]` per head.
        self.qkv = self.qkv.select_outputs(&[
            head_rows(&queries, 2 * dh, 0),
            head_rows(&kv, dh, 0),
            head_rows(&kv, dh, 0),
        ])?;
        (self.heads, self.kv_heads) = (queries.len(), kv.len());
        self.shard = Some(shard);
        Ok(())
    }

    /// `o_proj` of the gated heads' output `[B, S, heads · Dh]`, every rank's heads gathered
    /// first under tensor parallel.
    fn out(&self, o: &Tensor) -> Result<Tensor> {
        self.o_proj.forward(&all_heads(self.shard.as_ref(), o)?)
    }

    /// The run's prefill attention and score budget.
    pub fn set_variants(&mut self, v: &crate::LayerVariants) {
        self.prefill = v.attn_prefill;
        self.score_budget = v.attn_score_bytes;
    }

    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            qkv: self.qkv.into_device(device, dtype)?,
            o_proj: self.o_proj.into_device(device, dtype)?,
            q_norm: self.q_norm.into_device(device, dtype)?,
            k_norm: self.k_norm.into_device(device, dtype)?,
            rope_inv_freq: Some(self.rope.inv_freq_tensor(device)?),
            ..self
        })
    }

    /// `x`: `[B, S, H]` at positions `offset..offset+S`.
    pub fn forward(&self, x: &Tensor, cache: &mut KvCache, offset: usize) -> Result<Tensor> {
        self.forward_masked(x, cache, offset, None)
    }

    /// [`Attention::forward`] with the keys each query may see given by `mask`, an additive
    /// `[S, offset + S]` mask (0 or −∞) that replaces the causal one: the sparse attention of
    /// `qwen4_exp` (its indexer's selection). Composed ops only.
    pub fn forward_masked(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        offset: usize,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let (nq, dh) = (self.heads, self.head_dim);
        let (q, k, v, gate) = labelled("attention/qkv_prep", || {
            self.queries_and_keys(x, cache, offset)
        })?;
        let o = labelled("attention/core", || {
            self.attend_chunk(&q, &k, &v, offset, mask)
        })?;
        labelled("attention/out", || {
            let o = contiguous(&o.transpose(1, 2)?)?.reshape((b, s, nq * dh))?;
            let o = candle_op(o.mul(&sigmoid(&gate)?))?;
            self.out(&o)
        })
    }

    /// One decode step of several sequences, `x` `[1, B, H]`, row `i` the next token of the
    /// sequence whose keys and values are `caches[i]`, at position `offsets[i]`: the
    /// projections run once for all the rows (each weight read once), the attention per
    /// sequence over its own keys (ragged lengths).
    pub fn forward_batch(
        &self,
        x: &Tensor,
        caches: &mut [&mut KvCache],
        offsets: &[usize],
    ) -> Result<Tensor> {
        let (_, b, _) = x.dims3()?;
        let (nq, dh) = (self.heads, self.head_dim);
        let projected = self.project(x)?;
        let (outputs, gates): (Vec<Tensor>, Vec<Tensor>) = caches
            .iter_mut()
            .zip(offsets)
            .enumerate()
            .map(|(i, (cache, &offset))| {
                let row: Vec<Tensor> = projected
                    .iter()
                    .map(|p| p.narrow(1, i, 1))
                    .collect::<candle_core::Result<_>>()?;
                let row: [Tensor; 3] = row.try_into().expect("three projections");
                let (q, k, v, gate) = self.rotate_and_append(&row, cache, offset)?;
                let o = labelled("attention/core", || {
                    self.attend_chunk(&q, &k, &v, offset, None)
                })?;
                Ok((
                    contiguous(&o.transpose(1, 2)?)?.reshape((1, 1, nq * dh))?,
                    gate,
                ))
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        labelled("attention/out", || {
            let (o, gate) = (cat(&outputs, 1)?, cat(&gates, 1)?);
            debug_assert_eq!(o.dims(), &[1, b, nq * dh]);
            let o = candle_op(o.mul(&sigmoid(&gate)?))?;
            self.out(&o)
        })
    }

    /// `[query | gate, k, v]` of `x` `[B, S, H]`.
    fn project(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        labelled("attention/qkv_prep/proj", || {
            Ok(self.qkv.forward(x)?.try_into().expect("three projections"))
        })
    }

    /// The rotated queries `[B, Nq, S, Dh]`, every cached key and value `[B, Nkv, T, Dh]`
    /// after appending this chunk's, and the output gate `[B, S, Nq·Dh]`.
    fn queries_and_keys(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        offset: usize,
    ) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let projected = self.project(x)?;
        self.rotate_and_append(&projected, cache, offset)
    }

    /// [`Attention::queries_and_keys`] from the projections `[query | gate, k, v]` of one
    /// sequence's tokens at `offset`.
    fn rotate_and_append(
        &self,
        [qg, k, v]: &[Tensor; 3],
        cache: &mut KvCache,
        offset: usize,
    ) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let (b, s, _) = qg.dims3()?;
        let (nq, nkv, dh) = (self.heads, self.kv_heads, self.head_dim);
        let (q, k, v, gate) = labelled("attention/qkv_prep/norm", || {
            // A view of the merged projection: contiguous in decode, copied here in prefill
            // (as `reshape` would do uncounted).
            let qg = contiguous(qg)?.reshape((b, s, nq, 2 * dh))?;
            let (q, gate) = (
                qg.narrow(D::Minus1, 0, dh)?,
                contiguous(&qg.narrow(D::Minus1, dh, dh)?)?.reshape((b, s, nq * dh))?,
            );
            let q = self.q_norm.forward(&q)?.transpose(1, 2)?;
            let k = self
                .k_norm
                .forward(&contiguous(k)?.reshape((b, s, nkv, dh))?)?
                .transpose(1, 2)?;
            let v = contiguous(&contiguous(v)?.reshape((b, s, nkv, dh))?.transpose(1, 2)?)?;
            Ok((q, k, v, gate))
        })?;
        let (q, k) = labelled("attention/qkv_prep/rope", || {
            Ok((
                self.rope.forward(&q, offset)?,
                self.rope.forward(&k, offset)?,
            ))
        })?;
        let (k, v) = labelled("attention/qkv_prep/append", || cache.append(&k, &v))?;
        Ok((q, k, v, gate))
    }

    /// Attention of the chunk's queries over the cached keys: `[B, Nq, S, Dh]`.
    fn attend_chunk(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        offset: usize,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (_, _, s, dh) = q.dims4()?;
        let device_plan = !matches!(self.o_proj.weight, Weight::Host(_));
        let budget = self.score_budget;
        if let Some(mask) = mask {
            attend(q, k, v, offset, Some(mask), budget)
        } else if device_plan
            && s > 1
            && self.prefill == AttnPrefill::Kernel
            && prefill_kernel(q, k)
        {
            prefill_attend(q, k, v, offset)
        } else if device_plan && super::fused_attention::supported(dh, q.dtype(), s == 1) {
            fused_attend(q, k, v, offset, budget)
        } else {
            if !q.device().is_cpu() {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    eprintln!(
                        "note: no fused attention kernel for head dim {dh} in {:?} ({}); using matmul + softmax",
                        q.dtype(),
                        if s == 1 { "decode" } else { "prefill" }
                    )
                });
            }
            attend(q, k, v, offset, None, budget)
        }
    }
}

/// Additive causal mask `[S, T]` for queries at positions `offset..offset+S` over keys
/// `0..T`: 0 where key `j ≤` the query's position, −∞ elsewhere. Built on the device from two
/// position ranges: uploading an `[S, T]` table per prefill chunk would leave one pooled Metal
/// buffer per chunk until the next host sync.
pub fn causal_mask(
    s: usize,
    t: usize,
    offset: usize,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    causal_mask_tile(s, offset, 0, t, dtype, device)
}

/// [`causal_mask`] for the keys `key_start..key_start+T` only: `[S, T]`.
fn causal_mask_tile(
    s: usize,
    offset: usize,
    key_start: usize,
    t: usize,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let query_pos = Tensor::arange(offset as u32, (offset + s) as u32, device)?.reshape((s, 1))?;
    let key_pos =
        Tensor::arange(key_start as u32, (key_start + t) as u32, device)?.reshape((1, t))?;
    let visible = candle_op(key_pos.broadcast_le(&query_pos))?;
    let open = zeros((s, t), dtype, device)?;
    let closed = cast(&full(f32::NEG_INFINITY, (s, t), device)?, dtype)?;
    candle_op(visible.where_cond(&open, &closed))
}

/// One fused kernel (`candle_nn::ops::sdpa`): the vector kernel for a single query, the full
/// kernel in its causal mode for a chunk. That mode places the `S` queries at the last `S` of
/// the `T` key positions (`qL_off = kL − qL` in candle-metal-kernels 0.11.1
/// `src/kernels/sdpa.rs:171`, masking `row_pos < col_pos` in
/// `scaled_dot_product_attention.metal:2128–2135`), which is where a chunk appended to the KV
/// cache sits, so no mask is built. GQA is handled by the kernels. candle has them on Metal
/// only; elsewhere the same function is computed by [`attend`]: on the CPU counted as the one
/// launch it stands in for, on other GPUs (CUDA) counted as the composed ops it launches
/// (CUDA prefill chunks take [`prefill_attend`] before they get here, unless
/// [`AttnPrefill::Composed`] asks for the composed path). The query copy is made before, so
/// that it is counted on every device as on Metal. `budget`: as [`attend`]'s.
fn fused_attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    budget: usize,
) -> Result<Tensor> {
    let q = contiguous(q)?;
    if q.device().is_cpu() {
        return gdn_ops::launches::counted_as(1, || attend(&q, k, v, offset, None, budget));
    }
    if !q.device().is_metal() {
        return attend(&q, k, v, offset, None, budget);
    }
    let (_, _, s, dh) = q.dims4()?;
    let t = k.dim(2)?;
    anyhow::ensure!(
        t == offset + s,
        "attention: {s} queries at offset {offset} over {t} cached keys"
    );
    let scale = (dh as f32).powf(-0.5);
    candle_op(candle_nn::ops::sdpa(&q, k, v, None, s > 1, scale, 1.0))
}

/// Whether a prefill chunk of `q` `[B, Nq, S, Dh]` over `k` `[B, Nkv, T, Dh]` runs in
/// `gdn_ops::ops::attn_prefill`'s kernel: on CUDA, for the head dims and dtypes it covers
/// (the caller checks that the run did not ask for the composed path).
fn prefill_kernel(q: &Tensor, k: &Tensor) -> bool {
    let (Ok((_, nq, _, dh)), Ok((_, nkv, _, _))) = (q.dims4(), k.dims4()) else {
        return false;
    };
    gdn_ops::ops::attn_prefill::supports(q.device(), dh, nq, nkv, q.dtype())
}

/// Causal attention of a chunk in one CUDA kernel (flash attention's forward pass), reading K
/// and V where the cache holds them. The same function as [`attend`], rounded at the same
/// points but for the probabilities (see `gdn_ops::ops::attn_prefill`). The query copy is
/// counted, as in [`fused_attend`].
fn prefill_attend(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Result<Tensor> {
    let (_, _, s, _) = q.dims4()?;
    let t = k.dim(2)?;
    anyhow::ensure!(
        t == offset + s,
        "attention: {s} queries at offset {offset} over {t} cached keys"
    );
    gdn_ops::ops::attn_prefill::attn_prefill(&contiguous(q)?, k, v, offset)
}

/// Softmax attention of `q` `[B, Nq, S, Dh]` over `k`, `v` `[B, Nkv, T, Dh]`, where query
/// `i` sits at absolute position `offset + i` and sees keys `j ≤ offset + i`, or those
/// `mask` (additive `[S, T]`) leaves open. Computed in blocks whose score buffers stay under
/// `budget` bytes of f32 scores ([`blocked`]), whatever `T` is.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    mask: Option<&Tensor>,
    budget: usize,
) -> Result<Tensor> {
    blocked::attend(q, k, v, offset, mask, budget)
}

/// The keys a block of queries attends to, and how their scores are masked.
enum KeyMask<'a> {
    /// Causal for queries at `offset..`, over keys from `key_start`.
    Causal { offset: usize, key_start: usize },
    /// Every key visible to every query: no mask.
    Open,
    /// The rows and columns of an additive mask that belong to this block.
    Given(&'a Tensor),
}

/// Scaled, masked scores `[B, Nkv, rep·S, T]` of the folded queries `q` `[B, Nkv, rep·S, Dh]`
/// (row r is query r % S) against `k` `[B, Nkv, T, Dh]`, in `k`'s dtype.
fn scores(q: &Tensor, k: &Tensor, rep: usize, mask: KeyMask) -> Result<Tensor> {
    let (_, _, rows, dh) = q.dims4()?;
    let (s, t) = (rows / rep, k.dim(2)?);
    // K stays a view of the KV buffer (rows of Dh values, heads a buffer capacity apart):
    // the matmuls take a transposed K and row-strided operands as they are (CPU gemm and
    // cuBLAS), so no step copies the whole cache.
    let scores = matmul(q, &k.transpose(2, 3)?)?;
    let scores = candle_op(scores * (dh as f64).powf(-0.5))?;
    blocked::note_scores(&scores);
    let mask = match mask {
        KeyMask::Open => return Ok(scores),
        KeyMask::Given(m) => cast(m, scores.dtype())?,
        KeyMask::Causal { offset, key_start } => {
            causal_mask_tile(s, offset, key_start, t, scores.dtype(), q.device())?
        }
    };
    // Row r of the folded query axis is query r % s: `repeat` is a cat of `rep` copies.
    let mask = if rep > 1 {
        candle_ops(rep, mask.repeat((rep, 1)))?
    } else {
        mask
    };
    candle_op(scores.broadcast_add(&mask))
}

/// One block of queries over all its keys at once: `q` folded as in [`scores`], the result
/// `[B, Nkv, rep·S, Dh]`.
fn attend_dense(q: &Tensor, k: &Tensor, v: &Tensor, rep: usize, mask: KeyMask) -> Result<Tensor> {
    let scores = scores(q, k, rep, mask)?;
    let p = cast(&softmax_last_dim(&cast(&scores, DType::F32)?)?, v.dtype())?;
    matmul(&p, v)
}
