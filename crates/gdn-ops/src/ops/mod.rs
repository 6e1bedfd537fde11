//! Device ops, one module each (`ops/<op>/{mod.rs, cpu.rs, metal.rs, cuda.rs}`): the spec and
//! dispatch, the CPU twin, and the Metal and CUDA launches of `kernels/<op>.{metal,cu}`.

pub mod affine;
pub mod gated_delta;
pub mod moe_combine;
pub mod moe_route;
