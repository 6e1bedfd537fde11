//! Tensor parallel (issue 31): every rank holds every layer, but of each GDN layer only its
//! share of the value heads and of each attention layer only its share of the query heads,
//! each with the key (KV) heads they read (`layers/head_shard.rs`). A forward call runs on
//! every rank with the same tokens; each mixer computes its heads, one sum over the ranks
//! gathers every head's output, and every rank runs the output projection, the norms and the
//! feed-forward whole. So every rank's logits are bit for bit one process's, and every rank
//! picks the same token.
//!
//! What it is for: a mixer's work and its state (the GDN recurrent state, the KV cache) split
//! over the ranks; it combines with nothing else yet (the MoE and dense feed-forwards stay
//! whole on every rank: expert parallel is the plan that splits those). Each mixer waits for
//! one sum a step.
//!
//! Runs the reference plan (host weights, f32, the CPU) and the hybrid family (Qwen3-Next,
//! Qwen3.5/3.6); a rank reads the whole checkpoint and then drops the other ranks' head rows.

use crate::families::hybrid::Mixer;
use crate::families::Decoder;
use crate::layers::head_shard::HeadShard;
use crate::split_plan::SplitPlan;
use crate::{Config, Model, ModelPart, Plan};
use anyhow::{bail, Result};
use qwen_gdn_collective::{split_heads, World};
use std::ops::Range;

/// This rank's share of a tensor-parallel job over `world`.
pub struct TensorParallel {
    world: World,
    /// Every rank's GDN value heads, in rank order (none when the model has no GDN layer).
    gdn: Vec<Range<usize>>,
    /// Every rank's attention query heads, in rank order.
    attention: Vec<Range<usize>>,
}

impl TensorParallel {
    /// Splits each mixer kind's heads over the ranks of `world` (refused in one line when a
    /// rank would get none, or for a family whose mixers are not split).
    pub fn new(world: World, cfg: &Config) -> Result<Self> {
        if cfg.qwen4_exp.is_some() {
            bail!("tensor parallel runs the hybrid family (Qwen3-Next, Qwen3.5/3.6); qwen4_exp's mixers are not split (use --parallel experts or pipeline)");
        }
        let ranks = world.size();
        let gdn = match cfg.linear_num_value_heads {
            0 => vec![0..0; ranks],
            heads => split_heads(heads, ranks)
                .map_err(|e| anyhow::anyhow!("tensor parallel over the GDN value heads: {e}"))?,
        };
        let attention = split_heads(cfg.num_attention_heads, ranks)
            .map_err(|e| anyhow::anyhow!("tensor parallel over the attention heads: {e}"))?;
        Ok(Self {
            world,
            gdn,
            attention,
        })
    }

    pub fn ranks(&self) -> usize {
        self.world.size()
    }

    /// This rank's share of a mixer whose heads are split as `shares` (every rank's).
    fn share_of(&self, shares: &[Range<usize>]) -> HeadShard {
        HeadShard {
            heads: shares[self.rank()].clone(),
            total: shares.last().map_or(0, |r| r.end),
            world: self.world.clone(),
        }
    }
}

impl SplitPlan for TensorParallel {
    fn rank(&self) -> usize {
        self.world.rank()
    }

    /// Drops the other ranks' heads from every mixer of `model` and makes the mixers gather
    /// over the ranks. The reference plan only.
    fn apply(&self, model: &mut Model) -> Result<()> {
        if model.plan() != Plan::Reference {
            bail!("tensor parallel runs the reference plan (f32 on the CPU); this model was loaded on the {:?} plan", model.plan());
        }
        let Decoder::Hybrid(decoder) = model.decoder_mut() else {
            bail!("tensor parallel runs the hybrid family only");
        };
        for layer in &mut decoder.layers {
            match &mut layer.mixer {
                Mixer::Gdn(m) => m.shard_heads(self.share_of(&self.gdn))?,
                Mixer::Attention(m) => m.shard_heads(self.share_of(&self.attention))?,
            }
        }
        Ok(())
    }

    /// One line naming this rank's share and `host`, e.g. `tensor parallel, rank 1 of 2 on
    /// host-a: GDN value heads 2..4 of 4, attention heads 2..4 of 4 in each layer`.
    fn layout_line(&self, host: &str) -> String {
        let (g, a) = (self.share_of(&self.gdn), self.share_of(&self.attention));
        format!(
            "tensor parallel, rank {} of {} on {host}: GDN value heads {}..{} of {}, attention heads {}..{} of {} in each layer (output projections and feed-forwards on every rank)",
            self.rank(),
            self.ranks(),
            g.heads.start,
            g.heads.end,
            g.total,
            a.heads.start,
            a.heads.end,
            a.total,
        )
    }

    /// Refuses to run, on every rank with one line naming the rank that differs, unless all
    /// ranks load the same config and checkpoint (tensor headers) under the same plan.
    fn ensure_agreement(&self, model: &Model) -> Result<()> {
        crate::rank_agreement::ensure_ranks_agree(
            self.world.as_ref(),
            model,
            &format!("heads {:?} {:?}", self.gdn, self.attention),
            "config, checkpoint and tensor-parallel plan",
        )
    }

    /// The whole model: a rank drops the other ranks' head rows after the load.
    fn part(&self) -> ModelPart {
        ModelPart::Whole
    }
}
