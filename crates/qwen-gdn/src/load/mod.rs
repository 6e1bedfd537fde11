//! What `generate` and `eval` share: which checkpoint to open and how to load its model.

mod bf16_fallback;
mod from_flags;
pub mod input;
pub mod preflight;

use crate::load::input::InputLimit;
use crate::ui::output::eprint_line;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use qwen_gdn_model::weights::files::{check_regular, read_json_text};
use qwen_gdn_model::{Config, LoadProgress, Model, ModelPart, RunOptions, StateDtype};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// A local model folder, or a Hugging Face repo id (org/name) fetched into or reused from the
    /// HF cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
    /// HF_HUB_OFFLINE=1 uses the cache only; HF_TOKEN and HF_ENDPOINT are honoured;
    /// HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT (seconds, default 10) bound a silent Hub.
    #[arg(long, value_name = "FOLDER|REPO")]
    pub model: String,
    /// Branch, tag or commit of a Hub repo id [default: main]
    #[arg(long)]
    pub revision: Option<String>,
    /// Tokens per forward pass over the prompt (or the scored text); bounds peak memory
    #[arg(long, default_value_t = 2048, value_name = "N", value_parser = positive_usize)]
    pub prefill_chunk_size: usize,
    /// Storage dtype of the Gated DeltaNet recurrent state [default: f32, or bf16 when
    /// MLX_LM_GDN_STATE_BF16=1]
    #[arg(long, value_enum)]
    pub gdn_state_dtype: Option<GdnStateDtype>,
    /// Compute device: `auto` is the GPU when this build has Metal or CUDA and a GPU is
    /// present, else the CPU
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Activation dtype [default: f32 on CPU (the exact reference path), bf16 on a GPU].
    /// On CPU, bf16/f16 run the device path (weights as tensors, MoE routed by tensor ops)
    #[arg(long, value_enum, default_value_t = ComputeDtype::Auto)]
    pub dtype: ComputeDtype,
    /// CPU f32 path: round activations to 8 bits (one scale per 32 values) for 4-bit
    /// products, prefill and decode, and dot in integers (as llama.cpp does): faster, not
    /// exact (KL-gated in the tests)
    #[arg(long)]
    pub q8_activations: bool,
    /// GPU and device-plan decode: run each token on the composed ops instead of the fused
    /// decode kernels (the reference they are tested against; slower)
    #[arg(long)]
    pub composed_decode: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Metal,
    Cuda,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeDtype {
    Auto,
    F32,
    Bf16,
    F16,
}

impl ComputeDtype {
    /// The dtype on `device`: `auto` is f32 on the CPU and bf16 on a GPU.
    pub fn resolve(self, device: &Device) -> DType {
        match self {
            Self::Auto if device.is_cpu() => DType::F32,
            Self::Auto => DType::BF16,
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum GdnStateDtype {
    F32,
    Bf16,
}

impl From<GdnStateDtype> for StateDtype {
    fn from(d: GdnStateDtype) -> Self {
        match d {
            GdnStateDtype::F32 => StateDtype::F32,
            GdnStateDtype::Bf16 => StateDtype::Bf16,
        }
    }
}

/// A resolved checkpoint folder with its tokenizer: cheap to open, so prompts are checked
/// before gigabytes of weights are mapped.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub tokenizer: Tokenizer,
    /// tokenizer_config.json, when present: chat template and special tokens.
    pub tokenizer_config: Option<Json>,
    /// How much text the context can take.
    pub input_limit: InputLimit,
}

impl ModelArgs {
    pub fn open(&self) -> Result<Checkpoint> {
        let dir = crate::hub::resolve(&self.model, self.revision.as_deref())?;
        let path = dir.join("tokenizer.json");
        // A FIFO would block the tokenizer's read forever.
        if path.exists() {
            check_regular(&path)?;
        }
        let tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| anyhow::anyhow!("cannot load tokenizer {}: {e}", path.display()))?;
        let tokenizer_config = read_json_opt(&dir.join("tokenizer_config.json"))?;
        let config = Config::from_dir(&dir)?;
        let input_limit = InputLimit::new(
            &tokenizer,
            config.max_position_embeddings,
            &dir.join("config.json"),
        );
        Ok(Checkpoint {
            dir,
            tokenizer,
            tokenizer_config,
            input_limit,
        })
    }

    /// Loads the model for a run of at most `context` positions, refusing one that would not
    /// fit the GPU.
    pub fn load_model(&self, checkpoint: &Checkpoint, context: usize) -> Result<Model> {
        self.load_model_part(checkpoint, context, ModelPart::Whole)
    }

    /// [`ModelArgs::load_model`] of `part` of the model only (a pipeline stage's layers).
    pub fn load_model_part(
        &self,
        checkpoint: &Checkpoint,
        context: usize,
        part: ModelPart,
    ) -> Result<Model> {
        self.load_with(
            |device, state, dtype| {
                crate::load::preflight::check(device, &checkpoint.dir, context, state, dtype)
            },
            |device, opts| Model::load(&checkpoint.dir, device, opts),
            part,
        )
    }

    /// What [`ModelArgs::load_model`] does around the loading itself: the device, dtypes and
    /// options from the flags and the environment, `preflight` (may the model fit the
    /// device?), a progress bar around `build`, and the load's warnings.
    pub fn load_with(
        &self,
        preflight: impl FnOnce(&Device, StateDtype, DType) -> Result<()>,
        build: impl FnOnce(&Device, &RunOptions) -> Result<Model>,
        part: ModelPart,
    ) -> Result<Model> {
        // The environment's engine switches, before anything is loaded: a bad value stops
        // here, in one line.
        let env = RunOptions::from_env()?;
        // The flag overrides mlx-lm's environment switch.
        let gdn_state_dtype = match self.gdn_state_dtype {
            Some(d) => d.into(),
            None => env.gdn_state_dtype,
        };
        let device = select_device(self.device)?;
        let has_bf16 = qwen_gdn_model::bf16_supported(&device)?;
        let (dtype, gdn_state_dtype, notice) = crate::load::bf16_fallback::resolve(
            self.dtype.resolve(&device),
            gdn_state_dtype,
            has_bf16,
        );
        if let Some(notice) = notice {
            eprintln!("{notice}");
        }
        preflight(&device, gdn_state_dtype, dtype)?;
        let bar = crate::ui::progress::bytes(None, "loading weights");
        let shown = bar.clone();
        let opts = RunOptions {
            gdn_state_dtype,
            dtype,
            plan: None,
            q8_activations: self.q8_activations,
            progress: Some(LoadProgress::new(move |done, total| {
                shown.set_length(total);
                shown.set_position(done);
            })),
            fused_decode: !self.composed_decode,
            part,
            ..env
        };
        let model = build(&device, &opts);
        bar.finish_and_clear();
        let model = model?;
        for warning in model.load_warnings() {
            eprint_line(&format!("warning: {warning}"));
        }
        Ok(model)
    }
}

/// The device `--device` names; `auto` falls back to the CPU when there is no GPU.
pub fn select_device(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Metal => metal_device(),
        DeviceChoice::Auto => Ok(metal_device()
            .or_else(|_| cuda_device())
            .unwrap_or(Device::Cpu)),
        DeviceChoice::Cuda => cuda_device(),
    }
}

#[cfg(feature = "cuda")]
fn cuda_device() -> Result<Device> {
    Device::new_cuda(0).map_err(|e| {
        // The one-line cause, without the backtrace candle attaches when RUST_BACKTRACE is set.
        let cause = match e {
            candle_core::Error::WithBacktrace { inner, .. } => inner.to_string(),
            other => other.to_string(),
        };
        anyhow::anyhow!("--device cuda: no CUDA device available ({cause})")
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_device() -> Result<Device> {
    bail!("--device cuda: this qwen-gdn was built without CUDA (build it with scripts/gpu/build-cuda.sh)")
}

#[cfg(any(feature = "metal", target_os = "macos"))]
fn metal_device() -> Result<Device> {
    Device::new_metal(0)
        .map_err(|e| anyhow::anyhow!("--device metal: no Metal device available ({e})"))
}

#[cfg(not(any(feature = "metal", target_os = "macos")))]
fn metal_device() -> Result<Device> {
    bail!("--device metal: this qwen-gdn was built without Metal (build it on macOS, or with --features metal)")
}

/// Reads an optional JSON file: `None` when it does not exist, an error naming it if invalid,
/// not a regular file, or too large to be model metadata.
pub fn read_json_opt(path: &Path) -> Result<Option<Json>> {
    match read_json_text(path)? {
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("invalid JSON in {}", path.display())),
        None => Ok(None),
    }
}

pub fn positive_usize(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of at least 1".into()),
    }
}
