//! The plan one rank of a job runs (`generate` and `chat` under `mpirun`, or `--ranks N`):
//! a pipeline stage, or a share of every layer (expert or tensor parallel), with the forward
//! calls, the sampler's seed and the token every rank continues with.

use crate::cli::ranks::ParallelKind;
use anyhow::{ensure, Result};
use candle_core::Tensor;
use qwen_gdn_collective::World;
use qwen_gdn_model::expert_parallel::ExpertParallel;
use qwen_gdn_model::pipeline::Pipeline;
use qwen_gdn_model::split_plan::SplitPlan;
use qwen_gdn_model::tensor_and_experts::TensorAndExperts;
use qwen_gdn_model::tensor_parallel::TensorParallel;
use qwen_gdn_model::{Cache, Config, Model, ModelPart};

/// The plan this rank runs: a pipeline stage, or a share of every layer (expert or tensor
/// parallel), where every rank has the logits.
pub enum RankPlan {
    Pipeline(Pipeline, World),
    Split(Box<dyn SplitPlan + Send>, World),
}

impl RankPlan {
    /// This rank's share of `config`'s model under the plan `kind` over `world`.
    pub fn new(kind: ParallelKind, world: World, config: &Config) -> Result<Self> {
        Ok(match kind {
            ParallelKind::Pipeline => Self::Pipeline(
                Pipeline::new(world.clone(), config.num_hidden_layers)?,
                world,
            ),
            ParallelKind::Experts => Self::Split(
                Box::new(ExpertParallel::new(world.clone(), config.num_experts)?),
                world,
            ),
            ParallelKind::Tensor => {
                Self::Split(Box::new(TensorParallel::new(world.clone(), config)?), world)
            }
            ParallelKind::TensorExperts => Self::Split(
                Box::new(TensorAndExperts::new(world.clone(), config)?),
                world,
            ),
        })
    }

    /// One line naming this rank's share and host.
    pub fn layout_line(&self) -> String {
        let host = host_name();
        match self {
            Self::Pipeline(p, _) => p.layout_line(&host),
            Self::Split(e, _) => e.layout_line(&host),
        }
    }

    /// The job's ranks.
    pub fn world(&self) -> &World {
        match self {
            Self::Pipeline(_, world) | Self::Split(_, world) => world,
        }
    }

    pub fn rank(&self) -> usize {
        match self {
            Self::Pipeline(p, _) => p.rank(),
            Self::Split(e, _) => e.rank(),
        }
    }

    pub fn part(&self, layers: usize) -> ModelPart {
        match self {
            Self::Pipeline(p, _) => p.part(layers),
            Self::Split(e, _) => e.part(),
        }
    }

    /// Whether this rank has logits to pick tokens from.
    pub fn picks(&self) -> bool {
        match self {
            Self::Pipeline(p, _) => p.is_last(),
            Self::Split(..) => true,
        }
    }

    /// The sampler's seed: `asked`, or under a split plan (where every rank samples the same
    /// logits and must draw the same token) rank 0's random one, on every rank.
    pub fn seed(&self, asked: Option<u64>) -> Result<Option<u64>> {
        match (self, asked) {
            (Self::Split(_, world), None) => {
                Ok(Some(world.all_gather_u64(rand::random::<u64>())?[0]))
            }
            _ => Ok(asked),
        }
    }

    /// Ready `model` (loaded with [`RankPlan::part`]) and check every rank agrees on it.
    pub fn ready(&self, model: &mut Model) -> Result<()> {
        match self {
            Self::Pipeline(p, _) => p.ensure_agreement(model),
            Self::Split(e, _) => {
                e.apply(model)?;
                e.ensure_agreement(model)
            }
        }
    }

    pub fn prefill(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
        chunk: usize,
    ) -> Result<()> {
        match self {
            Self::Pipeline(p, _) => p.prefill(model, tokens, cache, chunk),
            Self::Split(..) => model.prefill(tokens, cache, chunk),
        }
    }

    pub fn forward_last(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
    ) -> Result<Option<Tensor>> {
        match self {
            Self::Pipeline(p, _) => p.forward_last(model, tokens, cache),
            Self::Split(..) => Ok(Some(model.forward_last(tokens, cache)?)),
        }
    }

    /// The token every rank continues with (`chosen` where this rank picked one).
    pub fn share_token(&self, chosen: Option<u32>) -> Result<u32> {
        match self {
            Self::Pipeline(p, _) => p.share_token(chosen),
            Self::Split(_, world) => {
                let token = chosen.ok_or_else(|| anyhow::anyhow!("a rank picked no token"))?;
                let all = world.all_gather_u64(u64::from(token))?;
                let differ = all.iter().position(|&t| t != u64::from(token));
                ensure!(
                    differ.is_none(),
                    "rank {} picked token {} where rank {} picked {token}: the ranks' logits differ",
                    differ.unwrap_or(0),
                    all[differ.unwrap_or(0)],
                    self.rank()
                );
                Ok(token)
            }
        }
    }
}

/// This host's name, for the layout line.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the name is cut at its first NUL below.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match ok && end > 0 {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "this host".into(),
    }
}
