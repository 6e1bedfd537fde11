//! What a `qwen4_exp` decode step reads that changes from token to token, prepared on the
//! host before the step and read by it from device tensors: the token id and its position,
//! the QSA indexer's rows and rotation ([`IndexerInputs`]), and each PLE layer's gathered
//! n-gram rows (the hash and the gather run on the host). The eager step uploads them anew
//! ([`StepValues::upload`]); a captured CUDA graph reads them from tensors allocated before
//! the capture and rewritten in place before each replay ([`StepInputs::write`]), so the
//! step itself uploads nothing and reads nothing back.

use super::qsa_indexer::{IndexerInputs, IndexerValues};
use super::state;
use super::{Qwen4ExpDecoder, Qwen4Mixer};
use crate::cache::{Cache, LayerCache};
use anyhow::{anyhow, bail, Result};
use candle_core::{Device, Tensor};

/// A step's inputs on the host.
#[derive(Debug, Clone)]
pub struct StepValues {
    pub token: u32,
    pub pos: u32,
    /// `None` in a model without QSA layers.
    pub indexer: Option<IndexerValues>,
    /// Per layer: a PLE layer's gathered rows `[row_width]` f32, `None` elsewhere.
    pub ple_rows: Vec<Option<Vec<f32>>>,
    /// Per layer: a PLE layer's n-gram context after the token (applied to the cache by
    /// [`StepValues::advance_contexts`] once the step ran).
    contexts: Vec<Option<Vec<u32>>>,
}

/// A step's inputs on the device.
#[derive(Debug)]
pub struct StepInputs {
    /// `[1]` u32.
    pub token: Tensor,
    /// `[1]` u32.
    pub pos: Tensor,
    pub indexer: Option<IndexerInputs>,
    /// Per layer: a PLE layer's rows `[1, row_width]` f32.
    pub ple_rows: Vec<Option<Tensor>>,
    /// Whether the step keeps every cache tensor it advances (the PLE windows, a composed
    /// GDN mixer's conv window and state) and writes it in place, as a CUDA graph's step
    /// must (it bakes their addresses in): one copy each. Off, they are replaced by new
    /// tensors, as the composed layers do.
    pub in_place: bool,
}

impl Qwen4ExpDecoder {
    /// The inputs of the step of `token` after what `cache` holds.
    pub fn step_values(&self, token: u32, cache: &Cache) -> Result<StepValues> {
        let mut ple_rows = Vec::with_capacity(self.layers.len());
        let mut contexts = Vec::with_capacity(self.layers.len());
        for (layer, c) in self.layers.iter().zip(&cache.layers) {
            let (rows, context) = match (&layer.ple, c) {
                (None, _) => (None, None),
                (Some(ple), LayerCache::Gdn(c)) => {
                    let state = state::ple(c)
                        .ok_or_else(|| anyhow!("cache lacks the per-layer embedding state"))?;
                    let (rows, context) = ple.rows(&state.context, &[token])?;
                    (Some(rows), Some(context))
                }
                _ => bail!("cache does not belong to this model"),
            };
            ple_rows.push(rows);
            contexts.push(context);
        }
        let indexer = self.layers.iter().find_map(|l| match &l.mixer {
            Qwen4Mixer::Qsa(q) => Some(q.indexer.step_values(cache.offset)),
            Qwen4Mixer::Gdn(_) => None,
        });
        Ok(StepValues {
            token,
            pos: u32::try_from(cache.offset)
                .map_err(|_| anyhow!("position {} past u32", cache.offset))?,
            indexer,
            ple_rows,
            contexts,
        })
    }
}

impl StepValues {
    /// New device tensors holding these values.
    pub fn upload(&self, device: &Device) -> Result<StepInputs> {
        Ok(StepInputs {
            token: Tensor::new(&[self.token], device)?,
            pos: Tensor::new(&[self.pos], device)?,
            indexer: self
                .indexer
                .as_ref()
                .map(|v| v.upload(device))
                .transpose()?,
            ple_rows: self
                .ple_rows
                .iter()
                .map(|r| {
                    r.as_ref()
                        .map(|r| Tensor::from_slice(r, (1, r.len()), device))
                        .transpose()
                })
                .collect::<candle_core::Result<_>>()?,
            in_place: false,
        })
    }

    /// Moves every PLE layer's n-gram context past the token (after its step ran).
    pub fn advance_contexts(&self, cache: &mut Cache) -> Result<()> {
        for (c, context) in cache.layers.iter_mut().zip(&self.contexts) {
            if let (LayerCache::Gdn(c), Some(context)) = (c, context) {
                state::ple_mut(c)
                    .ok_or_else(|| anyhow!("cache lacks the per-layer embedding state"))?
                    .context = context.clone();
            }
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
impl StepInputs {
    /// Rewrites these tensors in place with `v` (before a graph's replay).
    pub fn write(&self, dev: &candle_core::CudaDevice, v: &StepValues) -> Result<()> {
        use crate::cuda_graph::write;
        write(dev, &self.token, &[v.token])?;
        write(dev, &self.pos, &[v.pos])?;
        match (&self.indexer, &v.indexer) {
            (Some(t), Some(v)) => {
                write(dev, &t.tail_row, &v.tail_row)?;
                write(dev, &t.block_row, &v.block_row)?;
                write(dev, &t.cos, &v.cos)?;
                write(dev, &t.sin, &v.sin)?;
            }
            (None, None) => {}
            _ => bail!("step inputs of another model"),
        }
        for (t, v) in self.ple_rows.iter().zip(&v.ple_rows) {
            match (t, v) {
                (Some(t), Some(v)) => write(dev, t, v)?,
                (None, None) => {}
                _ => bail!("step inputs of another model"),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::cache::LayerCache;
    use crate::families::qwen4_exp::state;
    use crate::families::Decoder;
    use crate::tap::NoTap;
    use crate::{Model, Plan, RunOptions};
    use candle_core::{DType, Device, TensorId};

    /// The 4-bit fixture on the CPU, bf16 device plan (fused decode; its GDN mixers run
    /// composed, one layer has a PLE): the model the CPU tests of a graph's step run.
    pub(crate) fn tiny_4bit_on_cpu() -> Model {
        let dir = match std::env::var_os("QWEN_GDN_MODELS_DIR") {
            Some(d) => std::path::PathBuf::from(d),
            None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"),
        }
        .join("qwen4-exp-tiny-4bit");
        let opts = RunOptions {
            dtype: DType::BF16,
            plan: Some(Plan::Device),
            ..RunOptions::default()
        };
        Model::load(&dir, &Device::Cpu, &opts).unwrap()
    }

    /// The ids of the tensors a graph's step must keep: PLE windows, GDN conv windows and
    /// states.
    fn kept_ids(cache: &crate::Cache) -> Vec<Option<TensorId>> {
        cache
            .layers
            .iter()
            .flat_map(|l| match l {
                LayerCache::Gdn(c) => vec![
                    state::ple(c).map(|p| p.window.id()),
                    c.conv.as_ref().map(|t| t.id()),
                    c.state.as_ref().map(|t| t.id()),
                ],
                LayerCache::Attention(_) => Vec::new(),
            })
            .collect()
    }

    /// The step a CUDA graph captures (inputs in tensors, `in_place`) against the eager
    /// step on the CPU (4-bit fixture, bf16 device plan: its GDN mixers run composed, one
    /// layer has a PLE): bit for bit the same logits over 12 steps, past the QSA budget,
    /// with the PLE windows and the composed GDN mixers' conv windows and states kept (the
    /// same tensors, written in place) from the second step on.
    #[test]
    fn the_in_place_step_matches_the_eager_step() {
        let model = tiny_4bit_on_cpu();
        let Decoder::Qwen4Exp(d) = model.decoder() else {
            panic!("not a qwen4_exp model")
        };
        assert!(d.fused_decode());
        let ends = model.ends().unwrap();
        let (mut eager, mut kept) = (model.new_cache(), model.new_cache());
        model.prefill(&[3, 1, 4], &mut eager, 16).unwrap();
        model.prefill(&[3, 1, 4], &mut kept, 16).unwrap();
        let mut token = 1;
        let mut ids = None;
        for step in 0..12 {
            let want = d
                .decode_step(&ends, token, &mut eager, Some(&mut NoTap))
                .unwrap();
            let values = d.step_values(token, &kept).unwrap();
            let inputs = super::StepInputs {
                in_place: true,
                ..values.upload(&Device::Cpu).unwrap()
            };
            let got = d
                .decode_step_on(&ends, &inputs, &mut kept, &mut NoTap)
                .unwrap();
            values.advance_contexts(&mut kept).unwrap();
            let diff = (got - &want)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(diff, 0.0, "step {step}");
            let now = kept_ids(&kept);
            assert!(now.iter().any(Option::is_some));
            if let Some(before) = &ids {
                assert_eq!(&now, before, "step {step}: a kept tensor was replaced");
            }
            ids = Some(now);
            assert_eq!(kept.offset, eager.offset);
            token = crate::speculative::argmax(&want.flatten_all().unwrap().to_vec1().unwrap());
        }
    }
}
