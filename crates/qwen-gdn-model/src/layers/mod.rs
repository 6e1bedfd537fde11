//! Family-free building blocks (mixers, feed-forwards, norms, products, RoPE), one concept
//! per file; what only one family uses lives in its folder under `families/`.

pub mod attention;
pub mod fused_attention;
pub mod gdn;
pub mod head_shard;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod rope;
