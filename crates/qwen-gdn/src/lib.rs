//! qwen-gdn as a library: everything the `qwen-gdn` binary does, usable from Rust.
//!
//! - [`engine`]: the generation loop of `generate`, `chat` and `serve` ([`engine::Engine`]),
//!   with its prompt cache, stop strings and the [`engine::sampler`].
//! - [`load`]: which checkpoint to open (a folder or a Hub repo) and how to load its model.
//! - [`text`]: chat templates, the streaming detokenizer, the thinking split of a reply.
//! - [`tool_calls`]: tool calls in a reply (Qwen XML and Hermes JSON) and OpenAI messages.
//! - [`serve`]: the OpenAI-compatible HTTP server.
//! - [`hub`]: the Hugging Face Hub cache and downloads.
//! - [`cli`]: the command line (`qwen_gdn::cli::main` is the whole binary), [`ui`]: the
//!   terminal.
//!
//! The model itself (weights, layers, caches) is the `qwen-gdn-model` crate; its kernels are
//! `gdn-ops`.
//!
//! # Generating from Rust
//!
//! Open a checkpoint (its tokenizer, cheap), load its model, and hand both to an
//! [`engine::Engine`]; [`engine::Engine::generate`] streams the text and returns the tokens.
//! Here the shipped tiny Qwen3.5 checkpoint continues a raw prompt greedily, and its first
//! eight tokens are those mlx-lm generates (models/reference, written by
//! scripts/gen_fixtures.py):
//!
//! ```
//! use qwen_gdn::engine::sampler::SamplerConfig;
//! use qwen_gdn::engine::{Engine, FinishReason, GenerateParams, PromptTokens};
//! use qwen_gdn::load::ModelArgs;
//! use qwen_gdn_model::PromptCache;
//! use std::ops::ControlFlow;
//! use std::sync::atomic::AtomicBool;
//!
//! # fn main() -> anyhow::Result<()> {
//! let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models");
//! let model = format!("{models}/qwen3.5-tiny-4bit");
//! let args = ModelArgs::from_flags(["--model", model.as_str(), "--device", "cpu"])?;
//! let checkpoint = args.open()?;
//! let prompt = "Write a short story about a robot who learns to paint.";
//! let ids = checkpoint.tokenizer.encode(prompt, false).map_err(anyhow::Error::msg)?;
//! let prompt = PromptTokens::plain(ids.get_ids().to_vec());
//!
//! let loaded = args.load_model(&checkpoint, prompt.ids.len() + 8)?;
//! let no_prompt_cache = PromptCache::new(0);
//! let mut engine = Engine::new(checkpoint, loaded, args.prefill_chunk_size, no_prompt_cache, None)?;
//! let params = GenerateParams {
//!     max_tokens: 8,
//!     sampler: SamplerConfig::greedy(),
//!     seed: None,
//!     stop_strings: Vec::new(),
//! };
//! let mut text = String::new();
//! let never = AtomicBool::new(false);
//! let outcome = engine.generate(&prompt, &params, &never, &mut |piece| {
//!     text.push_str(piece);
//!     ControlFlow::Continue(())
//! })?;
//!
//! let reference: serde_json::Value = serde_json::from_slice(&std::fs::read(format!(
//!     "{models}/reference/qwen3.5-tiny-4bit.json"
//! ))?)?;
//! let ids = |key: &str| -> Vec<u32> {
//!     let list = reference[key].as_array().unwrap();
//!     list.iter().map(|v| v.as_u64().unwrap() as u32).collect()
//! };
//! assert_eq!(prompt.ids, ids("greedy_prompt_ids"));
//! assert_eq!(outcome.tokens, ids("greedy_ids")[..8]);
//! assert_eq!(outcome.finish, FinishReason::Length);
//! assert_eq!(text, engine.checkpoint().tokenizer.decode(&outcome.tokens, false).unwrap());
//! # Ok(())
//! # }
//! ```

mod atomic_file;
pub mod cli;
pub mod engine;
pub mod hub;
pub mod load;
pub mod serve;
#[cfg(test)]
mod test_support;
pub mod text;
pub mod tool_calls;
pub mod ui;
