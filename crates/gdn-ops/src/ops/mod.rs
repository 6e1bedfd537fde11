//! Device ops, one module each (`ops/<op>/{mod.rs, cpu.rs, metal.rs, cuda.rs}`): the spec and
//! dispatch, the CPU twin, and the Metal and CUDA launches of `kernels/<op>.{metal,cu}`.

pub mod add_rms_norm;
pub mod affine;
pub mod affine_grouped;
pub mod attn_decode;
pub mod attn_decode_slots;
pub mod attn_prefill;
pub mod attn_prep;
pub mod attn_prep_slots;
pub mod gated_delta;
pub mod gated_delta_norm;
pub mod gated_delta_norm_slots;
pub mod gated_delta_norm_window;
pub mod gated_rms_norm;
pub mod gdn_conv_prep;
pub mod gdn_conv_prep_slots;
pub mod greedy_pick;
pub mod hyper_connection;
pub mod indexer_pool;
pub mod moe_combine;
pub mod moe_route;

/// A dim or stride as the `u32` of a kernel's parameter struct: a one-line error naming the
/// op and the value where it does not fit.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
pub(crate) fn param_u32(op: &str, what: &str, n: usize) -> anyhow::Result<u32> {
    u32::try_from(n).map_err(|_| anyhow::anyhow!("{op}: {what} {n} exceeds u32"))
}
