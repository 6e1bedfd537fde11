//! The parallel plans in which every rank runs the whole forward call on the same tokens and
//! holds a share of some layers' work, combined by sums inside the call (expert parallel:
//! `expert_parallel.rs`; tensor parallel: `tensor_parallel.rs`), as one seam: the generation
//! loop is the same for both (each rank has the logits and picks the same token), only the
//! load and the model's split differ. The pipeline plan, where ranks hold different layers and
//! pass activations, is not one of them (`pipeline.rs`).

use crate::{Model, ModelPart};
use anyhow::Result;

pub trait SplitPlan {
    fn rank(&self) -> usize;
    /// What this rank loads of the checkpoint.
    fn part(&self) -> ModelPart;
    /// Cuts `model` (loaded with [`SplitPlan::part`]) to this rank's share and makes its
    /// layers combine over the ranks.
    fn apply(&self, model: &mut Model) -> Result<()>;
    /// Refuses to run, on every rank with one line, unless all ranks load the same config
    /// and checkpoint under the same plan.
    fn ensure_agreement(&self, model: &Model) -> Result<()>;
    /// One line naming this rank's share and `host`.
    fn layout_line(&self, host: &str) -> String;
}
