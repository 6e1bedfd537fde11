//! Pipeline parallel over layers (issue 31): each rank holds a contiguous range of decoder
//! layers ([`qwen_gdn_collective::split_layers`]), the first also the embedding, the last the
//! final norm and output head. A forward call (a prefill chunk or a decode step) runs stage
//! after stage: stage `i` sends its hidden states `[T, H]` (f32, whatever the run dtype) to
//! stage `i + 1`, one send per boundary; the last stage computes the logits, and the token it
//! picks goes back to every rank ([`Pipeline::share_token`]), so that all ranks run the same
//! generation loop and stop together.
//!
//! Every layer runs exactly as in one process, on the same input, so the last stage's f32
//! logits are bit for bit those of one rank (the gate: `tests/pipeline_mpi.rs`).

use crate::tap::NoTap;
use crate::{Cache, Model, ModelPart};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use qwen_gdn_collective::{split_layers, Stage, World};

/// How one generation is spread over processes, chosen by the launch (`mpirun -n N`,
/// `--ranks N`): everything in this process, or one stage of a pipeline.
pub enum ParallelPlan {
    Single,
    Pipeline(Pipeline),
}

impl ParallelPlan {
    /// The part of the model this process loads.
    pub fn part(&self, num_layers: usize) -> ModelPart {
        match self {
            Self::Single => ModelPart::Whole,
            Self::Pipeline(p) => p.part(num_layers),
        }
    }
}

/// This rank's stage of a pipeline over `world`.
pub struct Pipeline {
    world: World,
    stages: Vec<Stage>,
}

impl Pipeline {
    /// Splits `num_layers` layers over the ranks of `world` (refused when a rank would get none).
    pub fn new(world: World, num_layers: usize) -> Result<Self> {
        let stages = split_layers(num_layers, world.size())?;
        Ok(Self { world, stages })
    }

    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    pub fn ranks(&self) -> usize {
        self.world.size()
    }

    fn is_first(&self) -> bool {
        self.rank() == 0
    }

    /// Whether this rank computes the logits and picks the tokens.
    pub fn is_last(&self) -> bool {
        self.rank() + 1 == self.ranks()
    }

    /// The part of the model this rank loads.
    pub fn part(&self, num_layers: usize) -> ModelPart {
        debug_assert_eq!(self.stages.last().map(|s| s.layers.end), Some(num_layers));
        ModelPart::Stage {
            layers: self.stages[self.rank()].layers.clone(),
            first: self.is_first(),
            last: self.is_last(),
        }
    }

    /// One line naming this rank's stage and `host`, e.g.
    /// `pipeline stage 1 of 3 on host-a: layers 2..4 + final norm and output head`.
    pub fn layout_line(&self, host: &str) -> String {
        let stage = &self.stages[self.rank()];
        let mut line = format!(
            "pipeline stage {} of {} on {host}: layers {}..{}",
            self.rank(),
            self.ranks(),
            stage.layers.start,
            stage.layers.end
        );
        if self.is_first() {
            line.push_str(" + embedding");
        }
        if self.is_last() {
            line.push_str(" + final norm and output head");
        }
        line
    }

    /// Refuses to run, on every rank with one line naming the rank that differs, unless all
    /// ranks load the same config and checkpoint (tensor headers) under the same plan.
    pub fn ensure_agreement(&self, model: &Model) -> Result<()> {
        crate::rank_agreement::ensure_ranks_agree(
            self.world.as_ref(),
            model,
            &format!("pipeline {:?}", self.stages),
            "config, checkpoint and pipeline plan",
        )
    }

    /// Runs `tokens` through this stage's layers after what `cache` holds: from the embedding
    /// on the first stage, from the previous stage's hidden states elsewhere; the result goes
    /// to the next stage. Returns this stage's output hidden states `[1, T, H]`.
    fn run_stage(&self, model: &Model, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        let hidden = model.config().hidden_size;
        let received = if self.is_first() {
            None
        } else {
            let mut buf = vec![0f32; tokens.len() * hidden];
            self.world.receive(self.rank() - 1, &mut buf)?;
            let h = Tensor::from_vec(buf, (1, tokens.len(), hidden), model.device())?;
            Some(h.to_dtype(model.dtype())?)
        };
        let h = model.run_layers_from(received, tokens, cache, &mut NoTap)?;
        if !self.is_last() {
            let sent = h.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            ensure!(
                sent.len() == tokens.len() * hidden,
                "stage {} produced {} values for {} tokens of width {hidden}",
                self.rank(),
                sent.len(),
                tokens.len()
            );
            self.world.send(self.rank() + 1, &sent)?;
        }
        Ok(h)
    }

    /// [`Model::prefill`] over the pipeline: each chunk of at most `chunk` tokens goes through
    /// every stage; no logits.
    pub fn prefill(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
        chunk: usize,
    ) -> Result<()> {
        ensure!(chunk > 0, "prefill chunk size must be positive");
        for part in tokens.chunks(chunk) {
            self.run_stage(model, part, cache)?;
        }
        Ok(())
    }

    /// [`Model::forward_last`] over the pipeline: the last position's f32 logits
    /// `[1, vocab_size]` on the last stage, `None` on the others.
    pub fn forward_last(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
    ) -> Result<Option<Tensor>> {
        let h = self.run_stage(model, tokens, cache)?;
        if self.is_last() {
            Ok(Some(model.last_logits(&h, &mut NoTap)?))
        } else {
            Ok(None)
        }
    }

    /// The token the last stage picked (`chosen`, `Some` there and only there), on every
    /// rank: the last stage sends it to each other rank.
    pub fn share_token(&self, chosen: Option<u32>) -> Result<u32> {
        let last = self.ranks() - 1;
        if self.is_last() {
            let token =
                chosen.ok_or_else(|| anyhow::anyhow!("the last pipeline stage picked no token"))?;
            // The id travels as the bits of an f32 (MPI copies them untouched).
            for rank in 0..last {
                self.world.send(rank, &[f32::from_bits(token)])?;
            }
            Ok(token)
        } else {
            ensure!(
                chosen.is_none(),
                "only the last pipeline stage picks tokens"
            );
            let mut got = [0f32];
            self.world.receive(last, &mut got)?;
            Ok(got[0].to_bits())
        }
    }
}
