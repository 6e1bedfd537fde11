//! Qwen3-Next / Qwen3.5 / Qwen3.6 hybrid models on candle.
//!
//! Data flow: [`weights::Checkpoint`] maps the safetensors and sanitizes names and layouts →
//! [`Config`] and the layers in [`layers`] are built from it → [`Model::forward`] runs
//! tokens through embeddings, decoder layers (updating the [`Cache`] in place) and the head.

pub mod cache;
pub mod config;
pub mod device_memory;
pub mod diagnose;
pub mod families;
pub mod footprint;
pub mod layers;
pub mod load_progress;
pub mod model;
pub mod phase_profile;
pub mod prompt_cache;
pub mod tap;
pub mod tensor;
mod warm_up;
pub mod weights;

pub use cache::Cache;
pub use config::Config;
pub use gdn_ops::capability::bf16_supported;
pub use gdn_ops::StateDtype;
pub use load_progress::LoadProgress;
pub use model::Model;
pub use prompt_cache::{prefill_with_snapshots, PromptCache};
pub use weights::Weight;

use candle_core::DType;

/// Where weights live and how products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Weights in host memory, f32 products by the CPU kernels, MoE routed on the host: the
    /// exact path every other is tested against. CPU only, f32 only.
    Reference,
    /// Weights as tensors on the compute device (quantized ones stay quantized), every op on
    /// the device, MoE routed there: one host synchronisation per generated token. The plan
    /// of Metal (and CUDA); it also runs on the CPU, which is how its logic is tested.
    Device,
}

impl Plan {
    /// The reference plan for f32 on the CPU, the device plan otherwise.
    pub fn for_device(device: &candle_core::Device, dtype: DType) -> Self {
        if device.is_cpu() && dtype == DType::F32 {
            Self::Reference
        } else {
            Self::Device
        }
    }
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Activation dtype: f32 on the CPU, bf16 on Metal by default.
    pub dtype: DType,
    /// Storage dtype of the GDN recurrent state (fp32 unless asked otherwise).
    pub gdn_state_dtype: StateDtype,
    /// `None` picks [`Plan::for_device`].
    pub plan: Option<Plan>,
    /// Reference plan only: decode-shaped 4-bit products round each activation row to i8
    /// per 64 values and dot in integers (faster; judged by the KL gate, not exact).
    pub q8_activations: bool,
    /// Device plan: decode steps on the fused kernels (on by default; off runs the composed
    /// ops they are tested against).
    pub fused_decode: bool,
    /// Follows the bytes read from the checkpoint while loading.
    pub progress: Option<LoadProgress>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            gdn_state_dtype: StateDtype::F32,
            plan: None,
            q8_activations: false,
            fused_decode: true,
            progress: None,
        }
    }
}
