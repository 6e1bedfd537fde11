//! The layers of the hybrid model, one concept per file.

pub mod attention;
pub mod fused_attention;
pub mod gdn;
pub mod hyper_connection;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod ngram_hash;
pub mod norm;
pub mod ple;
pub mod qsa_indexer;
pub mod rope;
