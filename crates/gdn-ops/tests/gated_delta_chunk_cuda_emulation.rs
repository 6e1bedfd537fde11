//! The bodies of the shipped CUDA chunk kernels, `kernels/gated_delta_chunk.cu` (three passes:
//! `gdn_chunk::{prep,state,out}_kernel`, TF32 tensor-core products), compiled as C++ with
//! clang-19 on top of the Metal emulation plus CUDA stand-ins (`kernels/emu/cuda/`: blocks of
//! fibers, barriers, warp shuffles, wmma m16n16k8 TF32 fragments that read only the TF32 bits),
//! run on the CPU for all six InT/StT instantiations over whole chunks
//! (`kernels/emu/gated_delta_chunk_cuda_harness.cpp`) and compared with the token-by-token CPU
//! twin ([`gdn_ops::gated_delta_update_in`] in [`gdn_ops::GdnForm::Recurrent`]). What it cannot check is the GPU itself
//! (timing, the fragment layouts of real tensor cores): `tests/cuda_gated_delta_chunk.rs` does,
//! on the H100.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`, like the other emulation tests; it
//! never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates (those of tests/metal_emulation.rs): f32 state within 1e-5 of max |state|; a bf16
//! state exactly the kernel's f32-state sibling rounded once, that f32 state within 1e-5, and
//! bit-equal to the reference's bf16 state but for certified rounding-boundary straddles; y
//! within one InT ulp of the reference's y or 1e-5 of max |y|, exactly 0 at padded tokens.

mod common;
mod emu;
mod gated_delta_emu;

use common::gated_delta::INSTANTIATIONS;
use common::{St, Ty as In};
use gated_delta_emu::{
    assert_chunk_instantiations, assert_chunk_params, numbered, run_all, shape, Job, Kernel,
};
use gdn_ops::GdnForm;

static HARNESS: emu::Harness = emu::Harness::cuda("gated_delta_chunk_cuda_harness");

/// The cases: every instantiation over one chunk and three (T 64 and 192, the harness runs
/// whole chunks only: the tail is the recurrence kernel's; three chunks wrap the state pass's
/// two buffers) on one 32-column block of a 128-key head; padding masks; the models' head
/// shapes; the smallest and largest key dims.
fn jobs() -> Vec<Job> {
    let mut jobs = vec![];
    for &(inp, st) in &INSTANTIATIONS {
        for t in [64, 192] {
            jobs.push((inp, st, shape(1, t, 1, 2, 128, 32), false));
        }
        // Left padding in batch 0, scattered padding in batch 1, across a chunk boundary.
        jobs.push((inp, st, shape(2, 128, 1, 2, 128, 32), true));
    }
    for inp in [In::F32, In::Bf16] {
        // Qwen3-Next (ratio 2) and Qwen3.5 397B (ratio 4), Dk = Dv = 128.
        jobs.push((inp, St::F32, shape(1, 64, 1, 2, 128, 128), false));
        jobs.push((inp, St::F32, shape(1, 64, 1, 4, 128, 128), false));
    }
    jobs.push((In::F32, St::F32, shape(1, 64, 1, 2, 192, 128), false));
    jobs.push((In::F32, St::F32, shape(1, 128, 1, 1, 256, 32), false));
    // Above Dk = 128 the state pass has one buffer (16-bit K: raw rows, widened) and the out
    // pass loads the h rows past key 128 without holding them ahead.
    jobs.push((In::Bf16, St::Bf16, shape(1, 128, 1, 1, 256, 32), false));
    jobs.push((In::F32, St::F32, shape(1, 128, 2, 1, 16, 64), false));
    // The largest value head dim (pass 1 stages all of V).
    jobs.push((In::Bf16, St::F32, shape(2, 64, 1, 1, 64, 256), true));
    numbered(jobs)
}

#[test]
fn shipped_kernel_matches_the_cpu_reference() {
    run_all(
        &Kernel {
            harness: &HARNESS,
            magic: b"GDCCUDA1",
            name: "gated_delta_chunk",
            reference: Some(GdnForm::Recurrent),
        },
        jobs(),
    );
}

/// What the C++ build cannot see: the entry points the host looks up and their parameters, and
/// the parameter struct passed by value, which the host mirrors (`GdnChunkParams`,
/// ops/gated_delta/chunked.rs).
#[test]
fn kernel_abi_in_source() {
    let flat = emu::shipped_source("kernels/gated_delta_chunk.cu");
    assert_chunk_params();
    assert!(
        flat.contains("#include \"params/gated_delta_chunk.h\""),
        "gated_delta_chunk.cu must take GdnChunkParams from kernels/params/gated_delta_chunk.h"
    );
    for signature in [
        "const float* beta, const float* mask, float* gcum,",
        "float* w, float* u, const GdnChunkParams p)",
        "name(const InT* k, const float* gcum, const float* w, float* u, float* h, StT* state,",
        "const GdnChunkParams p)",
        "name(const InT* q, const InT* k, const float* gcum, const float* h, const float* v_new, const float* mask,",
        "InT* y, const GdnChunkParams p)",
    ] {
        assert!(
            flat.contains(signature),
            "the entry points' parameters changed (`{signature}` is gone): cuda_chunked.rs pushes them in that order"
        );
    }
    assert_chunk_instantiations(&flat, "ENTRY", |n| match n {
        "f32" => "float",
        "f16" => "__half",
        _ => "__nv_bfloat16",
    });
}
