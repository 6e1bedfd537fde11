//! The `qwen4_exp` family (docs/qwen4_exp.md): `S` residual streams mixed by
//! hyper-connections, GDN and QSA (indexed attention) mixers, MoE feed-forwards, and per-layer
//! n-gram embeddings read row by row from mapped tables. Everything only this family uses is
//! here; the shared mixers and MoE come from [`crate::layers`].

pub mod config;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_graph;
pub mod decoder;
pub mod fused;
pub mod hyper_connection;
pub mod indexed_attention;
pub mod mtp;
pub mod ngram_hash;
pub mod ngram_row_format;
pub mod ngram_tables;
pub mod ple;
pub mod qsa_indexer;
pub mod state;
pub mod step_counts;
pub mod step_inputs;

pub use decoder::{
    output_gate, HcChain, IndexedAttention, Qwen4ExpDecoder, Qwen4ExpLayer, Qwen4Mixer,
};
