//! The QSA indexer of `qwen4_exp` attention layers (docs/qwen4_exp.md §2.2): which keys each
//! query attends to. Keys are pooled into blocks of `c` tokens (mean of the raw index keys,
//! normalised, rotated at the block's first position); each query scores the complete blocks
//! with `Σ_heads relu(q·k) / √Di` and keeps the best `budget / c` of them plus the incomplete
//! tail block. Up to `(k+1)·c − 1` tokens of context this is plain causal attention.
//!
//! Reference (and composed) plan: the projection is a candle product, the pooling, scores and
//! top-k run on the host in f32 (they are small: one `Di` vector per block), at the cost of one
//! read-back of the projection per call. The fused decode step selects on the device instead
//! (`device.rs`), with the keys kept there.

mod device;

pub use device::{DeviceIndexKeys, IndexerInputs, IndexerValues};

use crate::config::qwen4_exp::QsaConfig;
use crate::layers::linear::Linear;
use crate::layers::rope::PartialRope;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::{anyhow, ensure, Result};
use candle_core::{DType, Device, Tensor};

/// What the indexer keeps per sequence: the pooled block keys and the raw keys of the
/// incomplete block.
#[derive(Debug, Clone, Default)]
pub struct IndexerCache {
    /// Normalised and rotated block keys, `Di` each.
    pub blocks: Vec<Vec<f32>>,
    /// Raw index keys of the tokens after the last complete block (fewer than `c`).
    pub tail: Vec<Vec<f32>>,
    /// Tokens seen.
    pub len: usize,
    /// The keys on the device, where the fused decode step keeps them: while set it holds
    /// every key and `blocks` and `tail` are empty ([`IndexerCache::to_host`] brings them
    /// back for the host selection of a prompt).
    pub device: Option<DeviceIndexKeys>,
}

impl IndexerCache {
    /// Bytes held (block keys and tail keys, f32).
    pub fn bytes(&self) -> u64 {
        let floats: usize = self.blocks.iter().chain(&self.tail).map(Vec::len).sum();
        4 * floats as u64 + self.device.as_ref().map_or(0, DeviceIndexKeys::bytes)
    }

    /// Moves the keys from the device to the host vectors (one read-back; nothing when they
    /// are already there).
    pub fn to_host(&mut self) -> Result<()> {
        if let Some(keys) = self.device.take() {
            let (blocks, tail) = keys.download()?;
            self.blocks = blocks;
            self.tail = tail;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct QsaIndexer {
    /// `[(n + 1)·Di, H]`: n query heads then the one key head.
    proj: Linear,
    /// `1 + w` of `q_layernorm` / `k_layernorm`.
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    rope: PartialRope,
    qsa: QsaConfig,
    eps: f32,
    /// The device plan's `1 + w` norms, f32 on the device (for the selection there).
    device_norms: Option<(Tensor, Tensor)>,
}

fn rms_norm_1p(x: &mut [f32], w: &[f32], eps: f32) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for (v, w) in x.iter_mut().zip(w) {
        *v *= inv * w;
    }
}

impl QsaIndexer {
    /// `prefix`: the attention module, e.g. `model.layers.2.self_attn`.
    pub fn load(ckpt: &Checkpoint, prefix: &str, cfg: &Config) -> Result<Self> {
        let qsa = cfg
            .qwen4_exp
            .as_ref()
            .and_then(|q| q.qsa)
            .ok_or_else(|| anyhow!("the config has no QSA indexer"))?;
        let di = qsa.head_dim;
        let norm = |n: &str| -> Result<Vec<f32>> {
            let name = format!("{prefix}.indexer.{n}.weight");
            Ok(ckpt
                .centred_norm(&name, &[di], &Device::Cpu)?
                .to_vec1::<f32>()?)
        };
        Ok(Self {
            proj: Linear::load(
                ckpt,
                &format!("{prefix}.indexer.index_qk_proj"),
                (qsa.n_heads + 1) * di,
                cfg.hidden_size,
                cfg,
            )?,
            q_norm: norm("q_layernorm")?,
            k_norm: norm("k_layernorm")?,
            rope: PartialRope::new(cfg.rope_dims(), cfg.rope_theta),
            qsa,
            eps: cfg.rms_norm_eps as f32,
            device_norms: None,
        })
    }

    /// The device plan's copy: the projection on `device` in `dtype`, the norms in f32 there
    /// for the fused decode step's selection (the composed step selects on the host, in f32).
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        let norm = |w: &[f32]| Tensor::from_slice(w, w.len(), device);
        Ok(Self {
            proj: self.proj.into_device(device, dtype)?,
            device_norms: Some((norm(&self.q_norm)?, norm(&self.k_norm)?)),
            ..self
        })
    }

    /// The indexer's sizes.
    pub fn config(&self) -> &QsaConfig {
        &self.qsa
    }

    /// Rotates the vectors `x` (`[rows, Di]`, row-major) at `positions`.
    fn rotate(&self, x: &[f32], positions: &[usize]) -> Result<Vec<f32>> {
        let di = self.qsa.head_dim;
        // Host work on host tensors (the selection runs on the host on both plans): no
        // device launch, so none is counted.
        gdn_ops::launches::counted_as(0, || {
            let mut out = Vec::with_capacity(x.len());
            for (row, &p) in x.chunks_exact(di).zip(positions) {
                let t = Tensor::from_slice(row, (1, 1, 1, di), &Device::Cpu)?;
                out.extend(self.rope.forward(&t, p)?.flatten_all()?.to_vec1::<f32>()?);
            }
            Ok(out)
        })
    }

    /// For the `S` tokens `x` (`[S, H]`, batch 1) at positions `offset..offset+S`: which of
    /// the `offset + S` keys each may see, as `[S][offset + S]` booleans. Advances `cache`.
    pub fn select(
        &self,
        x: &Tensor,
        cache: &mut IndexerCache,
        offset: usize,
    ) -> Result<Vec<Vec<bool>>> {
        ensure!(
            cache.len == offset,
            "QSA indexer: cache holds {} tokens, offset {offset}",
            cache.len
        );
        cache.to_host()?;
        let (n, di, c) = (self.qsa.n_heads, self.qsa.head_dim, self.qsa.compress_ratio);
        let s = x.dim(0)?;
        let qk = gdn_ops::launches::read_back(
            self.proj
                .forward(x)?
                .to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .to_vec2::<f32>(),
        )?;
        // Queries: per head norm, then RoPE at the token's position.
        let mut queries = Vec::with_capacity(s);
        for (i, row) in qk.iter().enumerate() {
            let mut q = row[..n * di].to_vec();
            for head in q.chunks_exact_mut(di) {
                rms_norm_1p(head, &self.q_norm, self.eps);
            }
            queries.push(self.rotate(&q, &vec![offset + i; n])?);
        }
        let scale = 1.0 / (di as f32).sqrt();
        let k = self.qsa.block_topk();
        let mut visible = Vec::with_capacity(s);
        for (i, row) in qk.iter().enumerate() {
            // The key of this token joins the tail; a full tail becomes a block.
            cache.tail.push(row[n * di..].to_vec());
            cache.len += 1;
            if cache.tail.len() == c {
                let mut pooled = vec![0f32; di];
                for key in &cache.tail {
                    pooled.iter_mut().zip(key).for_each(|(p, v)| *p += v);
                }
                pooled.iter_mut().for_each(|p| *p /= c as f32);
                rms_norm_1p(&mut pooled, &self.k_norm, self.eps);
                let start = cache.blocks.len() * c;
                cache.blocks.push(self.rotate(&pooled, &[start])?);
                cache.tail.clear();
            }
            let t = offset + i;
            let m = (t + 1) / c;
            debug_assert_eq!(m, cache.blocks.len());
            let mut open = vec![false; offset + s];
            if m <= k {
                open[..=t].iter_mut().for_each(|o| *o = true);
            } else {
                let q = &queries[i];
                let mut scored: Vec<(f32, usize)> = cache
                    .blocks
                    .iter()
                    .enumerate()
                    .map(|(b, kb)| {
                        let sc: f32 = q
                            .chunks_exact(di)
                            .map(|qh| qh.iter().zip(kb).map(|(a, b)| a * b).sum::<f32>().max(0.0))
                            .sum();
                        (sc * scale, b)
                    })
                    .collect();
                // Highest score first; among equal scores the earlier block (a fixed rule:
                // transformers' and mlx-vlm's picks are implementation-defined there).
                scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                for &(_, b) in &scored[..k] {
                    open[b * c..(b + 1) * c].iter_mut().for_each(|o| *o = true);
                }
                open[m * c..=t].iter_mut().for_each(|o| *o = true);
            }
            visible.push(open);
        }
        Ok(visible)
    }

    /// The additive mask `[S, T]` (0 open, −∞ closed) of a selection.
    pub fn mask(visible: &[Vec<bool>]) -> Result<Tensor> {
        let (s, t) = (visible.len(), visible.first().map_or(0, Vec::len));
        let data: Vec<f32> = visible
            .iter()
            .flat_map(|row| row.iter().map(|&o| if o { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        Ok(Tensor::from_vec(data, (s, t), &Device::Cpu)?)
    }
}
