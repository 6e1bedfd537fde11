//! Expert parallel (issue 31): every rank holds every layer but only its share of each MoE
//! block's experts ([`qwen_gdn_collective::split_experts`]); the router and the shared expert
//! are replicated. A forward call runs on every rank with the same tokens: attention, GDN and
//! routing are computed by each rank alike, each MoE block's experts by the rank that holds
//! them, and one sum over the ranks per MoE block combines them
//! (`layers/moe/expert_shard.rs`), so that every rank has the block's output, bit for bit one
//! process's, and every rank computes the same logits and picks the same token.
//!
//! What it is for: the experts are nearly all of an MoE model's bytes (Qwen3-Next-80B: 77 of
//! 80 B parameters), so N ranks hold about 1/N of the model each. What it costs: the
//! non-expert work is repeated on every rank, and each MoE layer waits for one reduction.
//!
//! Runs the reference plan (host weights, f32, the CPU). A rank loads [`ExpertParallel::part`]:
//! every layer, and of each MoE block only its own experts' bytes (the stacked expert tensors
//! are read for its rows only, and one-tensor-per-expert checkpoints drop the other experts'
//! tensors from view), so that its reading and its resident memory are its share. It maps the
//! checkpoint files whole, as every load does, but touches only its own pages.

use crate::layers::moe::ExpertShard;
use crate::split_plan::SplitPlan;
use crate::{Model, ModelPart, Plan};
use anyhow::{bail, ensure, Result};
use qwen_gdn_collective::{split_experts, World};
use std::ops::Range;

/// This rank's share of an expert-parallel job over `world`.
pub struct ExpertParallel {
    world: World,
    /// Every rank's experts, in rank order.
    shares: Vec<Range<usize>>,
}

impl ExpertParallel {
    /// Splits `num_experts` experts over the ranks of `world` (refused when a rank would get
    /// none).
    pub fn new(world: World, num_experts: usize) -> Result<Self> {
        ensure!(
            num_experts > 0,
            "expert parallel needs an MoE model (the config has no experts)"
        );
        let shares = split_experts(num_experts, world.size())?;
        Ok(Self { world, shares })
    }

    pub fn ranks(&self) -> usize {
        self.world.size()
    }

    /// This rank's experts of every MoE block.
    pub fn experts(&self) -> Range<usize> {
        self.shares[self.rank()].clone()
    }

    /// The share part of [`SplitPlan::layout_line`], e.g. `experts 3..6 of 8 in each MoE
    /// layer (router and shared expert on every rank)`.
    pub fn share_line(&self) -> String {
        let e = self.experts();
        let total = self.shares.last().map_or(0, |r| r.end);
        format!(
            "experts {}..{} of {total} in each MoE layer (router and shared expert on every rank)",
            e.start, e.end
        )
    }
}

impl SplitPlan for ExpertParallel {
    fn rank(&self) -> usize {
        self.world.rank()
    }

    /// What this rank loads: every layer, and its own experts of each MoE block.
    fn part(&self) -> ModelPart {
        ModelPart::Experts {
            share: self.experts(),
        }
    }

    /// Drops the other ranks' experts from every MoE block of `model` and makes the blocks
    /// combine over the ranks. The reference plan only.
    fn apply(&self, model: &mut Model) -> Result<()> {
        if model.plan() != Plan::Reference {
            bail!("expert parallel runs the reference plan (f32 on the CPU); this model was loaded on the {:?} plan", model.plan());
        }
        let total = self.shares.last().map_or(0, |r| r.end);
        let blocks = model.decoder_mut().moe_blocks_mut();
        ensure!(
            !blocks.is_empty(),
            "expert parallel: the model has no MoE blocks"
        );
        for block in blocks {
            block.shard_experts(ExpertShard {
                experts: self.experts(),
                total,
                world: self.world.clone(),
            })?;
        }
        Ok(())
    }

    /// One line naming this rank's share and `host`, e.g.
    /// `expert parallel, rank 1 of 3 on host-a: experts 3..6 of 8 in each MoE layer`.
    fn layout_line(&self, host: &str) -> String {
        format!(
            "expert parallel, rank {} of {} on {host}: {}",
            self.rank(),
            self.ranks(),
            self.share_line()
        )
    }

    /// Refuses to run, on every rank with one line naming the rank that differs, unless all
    /// ranks load the same config and checkpoint (tensor headers) under the same plan.
    fn ensure_agreement(&self, model: &Model) -> Result<()> {
        crate::rank_agreement::ensure_ranks_agree(
            self.world.as_ref(),
            model,
            &format!("experts {:?}", self.shares),
            "config, checkpoint and expert-parallel plan",
        )
    }
}
