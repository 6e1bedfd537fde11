//! Tensor and expert parallel together (issue 31): every rank holds its share of each mixer's
//! heads (`tensor_parallel.rs`) and its share of each MoE block's experts
//! (`expert_parallel.rs`), reading only its experts at load, so that with N ranks each holds
//! about 1/N of both the mixers' work and state and the experts' bytes (the layout SGLang and
//! vLLM serve large MoE models with). Both combine by exact sums, so the logits stay bit for
//! bit one process's.

use crate::expert_parallel::ExpertParallel;
use crate::split_plan::SplitPlan;
use crate::tensor_parallel::TensorParallel;
use crate::{Config, Model, ModelPart};
use anyhow::Result;
use qwen_gdn_collective::World;

pub struct TensorAndExperts {
    tensor: TensorParallel,
    experts: ExpertParallel,
}

impl TensorAndExperts {
    /// Both splits over `world` (each refused in one line as on its own).
    pub fn new(world: World, cfg: &Config) -> Result<Self> {
        Ok(Self {
            tensor: TensorParallel::new(world.clone(), cfg)?,
            experts: ExpertParallel::new(world, cfg.num_experts)?,
        })
    }
}

impl SplitPlan for TensorAndExperts {
    fn rank(&self) -> usize {
        self.tensor.rank()
    }

    fn part(&self) -> ModelPart {
        self.experts.part()
    }

    fn apply(&self, model: &mut Model) -> Result<()> {
        self.tensor.apply(model)?;
        self.experts.apply(model)
    }

    fn ensure_agreement(&self, model: &Model) -> Result<()> {
        self.tensor.ensure_agreement(model)?;
        self.experts.ensure_agreement(model)
    }

    fn layout_line(&self, host: &str) -> String {
        format!(
            "{}; {}",
            self.tensor.layout_line(host),
            self.experts.share_line()
        )
    }
}
