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

mod atomic_file;
pub mod cli;
pub mod engine;
pub mod hub;
pub mod load;
pub mod serve;
pub mod text;
pub mod tool_calls;
pub mod ui;
