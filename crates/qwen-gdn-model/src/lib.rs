//! Qwen3-Next / Qwen3.5 / Qwen3.6 hybrid models on candle.
//!
//! Data flow: [`weights::Checkpoint`] maps the safetensors and sanitizes names and layouts →
//! [`Config`] and the layers in [`layers`] are built from it → [`Model::forward`] runs
//! tokens through embeddings, decoder layers (updating the [`Cache`] in place) and the head.

pub mod batch;
pub mod cache;
pub mod cache_counts;
pub mod candle_ops;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda_graph;
pub mod device_memory;
pub mod diagnose;
pub mod expert_parallel;
pub mod families;
pub mod footprint;
pub mod layers;
pub mod load_progress;
pub mod model;
pub mod model_part;
pub mod options;
pub mod phase_profile;
pub mod pipeline;
pub mod prompt_cache;
mod rank_agreement;
pub mod speculative;
pub mod split_plan;
pub mod tap;
pub mod tensor;
pub mod tensor_and_experts;
pub mod tensor_parallel;
mod warm_up;
pub mod weights;

pub use batch::{Batch, BatchMoe, BatchProducts, SlotId};
pub use cache::Cache;
pub use config::Config;
pub use gdn_ops::capability::bf16_supported;
pub use gdn_ops::StateDtype;
pub use load_progress::LoadProgress;
pub use model::{Model, MtpPrecision, RandomWeights};
pub use model_part::ModelPart;
pub use options::{LayerVariants, RunOptions};
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
