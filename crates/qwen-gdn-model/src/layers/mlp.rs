//! Dense SwiGLU MLP: `down(silu(gate(x)) · up(x))`.

use super::linear::{FusedLinear, Linear};
use crate::candle_ops::swiglu;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::Result;
use candle_core::Tensor;

#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[gate_proj | up_proj]`, one pass over x.
    gate_up: FusedLinear,
    down: Linear,
}

impl Mlp {
    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        hidden: usize,
        inner: usize,
        cfg: &Config,
    ) -> Result<Self> {
        Ok(Self {
            gate_up: FusedLinear::new(vec![
                Linear::load(ckpt, &format!("{prefix}.gate_proj"), inner, hidden, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.up_proj"), inner, hidden, cfg)?,
            ]),
            down: Linear::load(ckpt, &format!("{prefix}.down_proj"), hidden, inner, cfg)?,
        })
    }

    /// From host projections (tests and loaders that build their own weights).
    pub fn from_parts(gate: Linear, up: Linear, down: Linear) -> Self {
        Self {
            gate_up: FusedLinear::new(vec![gate, up]),
            down,
        }
    }

    /// `[gate | up]` merged into one matrix, and the down projection: what a stacked or
    /// fused SwiGLU needs (`None` when gate and up could not be merged).
    pub fn merged_parts(&self) -> Option<(&Linear, &Linear)> {
        Some((self.gate_up.merged()?, &self.down))
    }

    pub fn into_device(
        self,
        device: &candle_core::Device,
        dtype: candle_core::DType,
    ) -> Result<Self> {
        Ok(Self {
            gate_up: self.gate_up.into_device(device, dtype)?,
            down: self.down.into_device(device, dtype)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up]: [Tensor; 2] = self
            .gate_up
            .forward(x)?
            .try_into()
            .expect("two projections");
        let act = swiglu(&gate, &up)?;
        self.down.forward(&act)
    }
}
