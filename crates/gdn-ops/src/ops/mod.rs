//! Device ops, one module each (`ops/<op>/{mod.rs, cpu.rs, metal.rs, cuda.rs}`): the spec and
//! dispatch, the CPU twin, and the Metal and CUDA launches of `kernels/<op>.{metal,cu}`.

pub mod add_rms_norm;
pub mod affine;
pub mod affine_grouped;
pub mod attn_decode;
pub mod attn_prefill;
pub mod attn_prep;
pub mod gated_delta;
pub mod gated_delta_norm;
pub mod gated_rms_norm;
pub mod gdn_conv_prep;
pub mod greedy_pick;
pub mod moe_combine;
pub mod moe_route;
