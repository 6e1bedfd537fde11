//! The hybrid family: Qwen3-Next, Qwen3.5 and Qwen3.6 (dense or MoE). Decoder layers of a
//! GDN or gated attention mixer and an MLP or MoE ([`layer`]), a final RMSNorm, and the fused
//! decode step of the device plan ([`decode`]; replayed from a CUDA graph on CUDA,
//! `cuda_graph.rs`).

pub mod batch_decode;
#[cfg(feature = "cuda")]
pub(crate) mod batch_graph;
pub mod config;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_graph;
pub mod decode;
pub mod layer;
pub mod mtp;
pub mod verify;
#[cfg(feature = "cuda")]
pub(crate) mod verify_graph;
mod verify_replays;

pub use decode::LayerCoverage;
pub use layer::{DecoderLayer, FeedForward, Mixer};
pub use mtp::MtpHead;

use crate::cache::{Cache, LayerCache};
use crate::layers::norm::RmsNorm;
use crate::tap::{each_layer, Tap};
use crate::weights::Checkpoint;
use crate::{Config, ModelPart, Plan, StateDtype};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::moe_combine::CombineKernel;

/// The hybrid family's layers and final norm, and how its decode steps run.
#[derive(Debug)]
pub struct HybridDecoder {
    /// The layers this process holds: all of them, or one pipeline stage's.
    pub layers: Vec<DecoderLayer>,
    /// The final norm; `None` on a pipeline stage other than the last.
    pub norm: Option<RmsNorm>,
    /// Decode steps run on the fused kernels (device plan); off, they run the composed ops.
    fused_decode: bool,
    /// Per layer, what the fused kernels cover.
    coverage: Vec<LayerCoverage>,
    /// Decode steps and verify passes on CUDA replay captured graphs (`RunOptions::cuda_graph`,
    /// read once).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    cuda_graph: bool,
    /// The fused step's MoE combine kernel (`RunOptions::moe_combine`).
    moe_combine: CombineKernel,
    /// The CUDA decode step last captured, replayed while the cache a step is given holds
    /// the very tensors it was captured against (`cuda_graph.rs`).
    #[cfg(feature = "cuda")]
    decode_graph: std::sync::Mutex<Option<cuda_graph::DecodeGraph>>,
    /// The CUDA verify passes captured, one per number of rows (`verify_graph.rs`).
    #[cfg(feature = "cuda")]
    verify_graphs: std::sync::Mutex<Vec<verify_graph::VerifyGraph>>,
    /// The CUDA batched steps captured, one per batch size (`batch_graph.rs`).
    #[cfg(feature = "cuda")]
    batch_graphs: std::sync::Mutex<Vec<batch_graph::BatchGraph>>,
    /// The batched step's positions, `[B]` u32 on the device, rewritten in place each step
    /// (`batch_decode.rs`): the slot kernels' tables hold their addresses, which must not
    /// change from step to step for the tables to be reused.
    batch_positions: std::sync::Mutex<Option<Tensor>>,
}

impl HybridDecoder {
    /// The layers of `part` and, when it has the head, the final norm; on the device plan each
    /// layer moves to `device` as soon as it is built, so that the host holds at most one layer
    /// beyond the mapped files.
    pub fn load(
        ckpt: &Checkpoint,
        cfg: &Config,
        plan: Plan,
        device: &Device,
        dtype: DType,
        part: &ModelPart,
    ) -> Result<Self> {
        let layers = part
            .layers(cfg.num_hidden_layers)
            .map(|i| {
                let layer = DecoderLayer::load(ckpt, i, cfg)?;
                match plan {
                    Plan::Reference => Ok(layer),
                    Plan::Device => layer.into_device(device, dtype),
                }
                .map_err(|e| e.context(format!("loading layer {i}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = match part.has_head() {
            true => Some(
                RmsNorm {
                    weight: ckpt.norm("model.norm.weight", cfg.hidden_size, &Device::Cpu)?,
                    eps: cfg.rms_norm_eps as f32,
                }
                .into_device(device, dtype)?,
            ),
            false => None,
        };
        let coverage = decode::fused_coverage(&layers, dtype);
        Ok(Self {
            layers,
            norm,
            fused_decode: false,
            coverage,
            cuda_graph: true,
            moe_combine: CombineKernel::Auto,
            #[cfg(feature = "cuda")]
            decode_graph: std::sync::Mutex::new(None),
            #[cfg(feature = "cuda")]
            verify_graphs: std::sync::Mutex::new(Vec::new()),
            #[cfg(feature = "cuda")]
            batch_graphs: std::sync::Mutex::new(Vec::new()),
            batch_positions: std::sync::Mutex::new(None),
        })
    }

    /// The run's kernel variants for every mixer (the MoE's through [`Self::set_moe_prefill`]).
    pub fn set_variants(&mut self, v: &crate::LayerVariants) {
        for layer in &mut self.layers {
            match &mut layer.mixer {
                Mixer::Gdn(m) => m.set_variants(v),
                Mixer::Attention(m) => m.set_variants(v),
            }
        }
        self.cuda_graph = v.cuda_graph;
        self.moe_combine = v.moe_combine;
    }

    /// Decode steps on the fused kernels (`on`, device plan only) or the composed ops. Layers
    /// outside the kernels' coverage always run composed, and are named once on stderr.
    pub fn set_fused_decode(&mut self, on: bool, dtype: DType) {
        self.fused_decode = on;
        if !on {
            return;
        }
        let composed: Vec<String> = self
            .coverage
            .iter()
            .enumerate()
            .filter(|(_, c)| !(c.mixer && c.feed_forward))
            .map(|(i, c)| {
                let part = match (c.mixer, c.feed_forward) {
                    (false, false) => "mixer and feed-forward",
                    (false, true) => "mixer",
                    _ => "feed-forward",
                };
                format!("{i} ({part})")
            })
            .collect();
        if !composed.is_empty() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                eprintln!(
                    "note: no fused decode kernels for layers {} in {dtype:?}; they run composed ops",
                    composed.join(", "),
                )
            });
        }
    }

    pub fn fused_decode(&self) -> bool {
        self.fused_decode
    }

    /// The final norm (every process but a pipeline's non-last stages holds it).
    pub fn final_norm(&self) -> Result<&RmsNorm> {
        self.norm
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this pipeline stage does not hold the final norm"))
    }

    /// Per layer, whether the fused decode kernels cover its mixer and its feed-forward.
    pub fn coverage(&self) -> &[LayerCoverage] {
        &self.coverage
    }

    /// A fresh state per layer: GDN conv window and recurrent state, or keys and values.
    pub fn new_cache(&self, state_dtype: StateDtype) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|l| l.new_cache(state_dtype))
            .collect()
    }

    /// The composed layers on the embedded tokens `h` `[1, S, H]` at the cache's offset:
    /// the last hidden states `[1, S, H]`, before the final norm (the offset is the
    /// caller's to advance).
    pub fn forward(&self, h: Tensor, cache: &mut Cache, tap: &mut dyn Tap) -> Result<Tensor> {
        let offset = cache.offset;
        each_layer(
            &self.layers,
            &mut cache.layers,
            tap,
            h,
            |i, layer, c, h, tap| layer.forward(i, &h, c, offset, tap),
        )
    }

    /// One decode step of several sequences on the composed layers: row `i` of `h`
    /// `[1, B, H]` is the embedded next token of the sequence `caches[i]` holds, at that
    /// cache's offset (the caller advances them). The last hidden states `[1, B, H]`.
    pub fn forward_batch(
        &self,
        h: Tensor,
        caches: &mut [&mut Cache],
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let offsets: Vec<usize> = caches.iter().map(|c| c.offset).collect();
        let mut per_layer = per_layer(self.layers.len(), caches)?;
        each_layer(
            &self.layers,
            &mut per_layer,
            tap,
            h,
            |i, layer, c, h, tap| layer.forward_batch(i, &h, c, &offsets, tap),
        )
    }
}

/// The sequences' caches regrouped by layer: entry `i` holds every sequence's state on layer
/// `i` (what a batched step's layer loop takes).
fn per_layer<'a>(
    layers: usize,
    caches: &'a mut [&mut Cache],
) -> Result<Vec<Vec<&'a mut LayerCache>>> {
    let mut per_layer: Vec<Vec<&mut LayerCache>> = (0..layers).map(|_| vec![]).collect();
    for cache in caches.iter_mut() {
        anyhow::ensure!(
            cache.layers.len() == layers,
            "cache does not belong to this model"
        );
        for (layer, c) in per_layer.iter_mut().zip(cache.layers.iter_mut()) {
            layer.push(c);
        }
    }
    Ok(per_layer)
}
