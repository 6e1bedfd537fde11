//! Every host-side count a `qwen4_exp` decode step advances: the cache's offset and KV
//! lengths ([`Bookkeeping`]), each QSA indexer's tokens, blocks and tail keys, each PLE
//! layer's n-gram context. A CUDA graph's capture (`cuda_graph.rs`) records the step after
//! an eager run of it, on the eager run's tensors and from these counts as they were before
//! it: a count left advanced would make the recorded step see another position (as the
//! indexer's did: "128 blocks and 1 tail keys at position 512").

use super::state;
use crate::cache::{Cache, LayerCache};
use crate::cache_counts::Bookkeeping;
use anyhow::{anyhow, Result};

/// A cache's counts, saved to be put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepCounts {
    shared: Bookkeeping,
    family: Vec<FamilyCounts>,
}

impl StepCounts {
    pub fn of(cache: &Cache) -> Self {
        Self {
            shared: Bookkeeping::of(cache),
            family: family_counts(cache),
        }
    }

    /// Puts these counts back into `cache` (its tensors stay), whose indexer keys a step
    /// moved to the device.
    pub fn restore(&self, cache: &mut Cache) -> Result<()> {
        self.shared.restore(cache);
        restore_family_counts(cache, &self.family)
    }
}

/// Per layer, this family's host-side counts a step advances: a QSA layer's indexer
/// (tokens seen, complete blocks, tail keys: the device keys' counts, or the host keys'
/// before the first device step moved them) and a PLE layer's n-gram context. With
/// [`Bookkeeping`] (offset, KV lengths) every host-side count of a step: a capture starts
/// from them as they were before the eager step.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FamilyCounts {
    Indexer {
        len: usize,
        blocks: usize,
        tail: usize,
    },
    Ple(Vec<u32>),
    None,
}

fn family_counts(cache: &Cache) -> Vec<FamilyCounts> {
    cache
        .layers
        .iter()
        .map(|l| match l {
            LayerCache::Attention(c) => match state::indexer(c) {
                Some(i) => {
                    let (blocks, tail) = match &i.device {
                        Some(keys) => keys.counts(),
                        None => (i.blocks.len(), i.tail.len()),
                    };
                    FamilyCounts::Indexer {
                        len: i.len,
                        blocks,
                        tail,
                    }
                }
                None => FamilyCounts::None,
            },
            LayerCache::Gdn(c) => match state::ple(c) {
                Some(p) => FamilyCounts::Ple(p.context.clone()),
                None => FamilyCounts::None,
            },
        })
        .collect()
}

/// Puts `counts` back into `cache`, whose indexer keys the eager step moved to the device.
fn restore_family_counts(cache: &mut Cache, counts: &[FamilyCounts]) -> Result<()> {
    for (l, counts) in cache.layers.iter_mut().zip(counts) {
        match (l, counts) {
            (LayerCache::Attention(c), &FamilyCounts::Indexer { len, blocks, tail }) => {
                let ix = state::indexer_mut(c)
                    .ok_or_else(|| anyhow!("cache lacks the QSA indexer state"))?;
                ix.len = len;
                ix.device
                    .as_mut()
                    .ok_or_else(|| anyhow!("QSA indexer keys not on the device after a step"))?
                    .set_counts((blocks, tail));
            }
            (LayerCache::Gdn(c), FamilyCounts::Ple(context)) => {
                state::ple_mut(c)
                    .ok_or_else(|| anyhow!("cache lacks the PLE state"))?
                    .context
                    .clone_from(context);
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::Decoder;
    use crate::tap::NoTap;
    use candle_core::Device;

    /// A capture's bookkeeping on the CPU (4-bit fixture, bf16 device plan): from a prefilled
    /// cache (the indexer's keys still on the host), at each of 6 positions (a block
    /// completes among them), the graph's step runs, its counts are put back, and the same
    /// step runs again from them (as the capture records it): the second run must find the
    /// counts the first started from (the indexer checks its blocks and tail against the
    /// position) and leave the counts the first left.
    #[test]
    fn a_step_runs_again_from_the_restored_counts() {
        let model = super::super::step_inputs::tests::tiny_4bit_on_cpu();
        let Decoder::Qwen4Exp(d) = model.decoder() else {
            panic!("not a qwen4_exp model")
        };
        assert!(d.fused_decode());
        let ends = model.ends().unwrap();
        let mut cache = model.new_cache();
        model.prefill(&[3, 1, 4], &mut cache, 16).unwrap();
        let indexers = |c: &StepCounts| {
            c.family
                .iter()
                .filter(|f| matches!(f, FamilyCounts::Indexer { .. }))
                .count()
        };
        for (step, token) in [1u32, 5, 9, 2, 6, 5].into_iter().enumerate() {
            let before = StepCounts::of(&cache);
            assert!(indexers(&before) > 0 && before.family.contains(&FamilyCounts::None));
            let values = d.step_values(token, &cache).unwrap();
            let inputs = super::super::step_inputs::StepInputs {
                in_place: true,
                ..values.upload(&Device::Cpu).unwrap()
            };
            d.decode_step_on(&ends, &inputs, &mut cache, &mut NoTap)
                .unwrap();
            let after = StepCounts::of(&cache);
            assert_ne!(after, before, "step {step}: nothing counted");
            before.restore(&mut cache).unwrap();
            assert_eq!(StepCounts::of(&cache), before, "step {step}: restored");
            d.decode_step_on(&ends, &inputs, &mut cache, &mut NoTap)
                .unwrap_or_else(|e| panic!("step {step}: the step again: {e:#}"));
            assert_eq!(StepCounts::of(&cache), after, "step {step}: counted again");
            values.advance_contexts(&mut cache).unwrap();
        }
    }
}
