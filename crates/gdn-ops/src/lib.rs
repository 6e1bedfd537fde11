//! Custom ops for qwen-gdn: the fused gated-delta recurrence of Gated DeltaNet layers, MLX
//! affine-quantized matrices (host and device, all in [`ops::affine`]) and the fused decode
//! kernels.
//!
//! Each device op lives in `ops/<op>/`: `mod.rs` is its spec (dims, parameters, input checks)
//! and dispatch, `cpu.rs` the CPU twin every GPU kernel is tested against, `metal.rs` and
//! `cuda.rs` the launches of `kernels/<op>.metal` and `kernels/<op>.cu`. What the backends
//! share is in [`backend`].

pub mod backend;
pub mod capability;
pub mod launches;
pub mod ops;
pub mod profile;
pub mod simd;
pub mod slot_tables;
pub mod thread_flag;
pub mod threads;

pub use ops::gated_delta::{
    gated_delta_update, gated_delta_update_chunked, gated_delta_update_in,
    gated_delta_update_masked, GdnDims, GdnForm,
};

use anyhow::{bail, Result};
use candle_core::DType;

/// Storage dtype of the GDN recurrent state. fp32 is the default: writing the state back in
/// bf16 every step is what made Qwen3.5 output incoherent elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateDtype {
    #[default]
    F32,
    Bf16,
}

impl StateDtype {
    /// What mlx-lm's switch `MLX_LM_GDN_STATE_BF16` (read by the caller) asks for, with
    /// mlx-lm's rule: bf16 only when it is exactly `1`; anything else keeps fp32.
    pub fn from_env_value(value: Option<&str>) -> Self {
        if value == Some("1") {
            Self::Bf16
        } else {
            Self::F32
        }
    }

    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
        }
    }
}

impl std::str::FromStr for StateDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "fp32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => bail!("invalid GDN state dtype `{other}` (expected f32 or bf16)"),
        }
    }
}
