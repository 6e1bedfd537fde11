//! Qwen3-Next / Qwen3.5 / Qwen3.6 hybrid models on candle.
//!
//! Data flow: [`weights::Checkpoint`] maps the safetensors and sanitizes names and layouts →
//! [`Config`] and the layers in [`layers`] are built from it → [`Model::forward`] runs
//! tokens through embeddings, decoder layers (updating the [`Cache`] in place) and the head.

pub mod cache;
pub mod config;
pub mod layers;
pub mod model;
pub mod weights;

pub use cache::Cache;
pub use config::Config;
pub use gdn_ops::StateDtype;
pub use model::Model;

use candle_core::DType;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Activation dtype. The CPU reference path computes in f32.
    pub dtype: DType,
    /// Storage dtype of the GDN recurrent state (fp32 unless asked otherwise).
    pub gdn_state_dtype: StateDtype,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            gdn_state_dtype: StateDtype::F32,
        }
    }
}
