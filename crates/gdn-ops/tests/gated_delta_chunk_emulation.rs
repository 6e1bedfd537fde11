//! The shipped chunked gated-delta kernel, `kernels/gated_delta_chunk.metal` (simdgroup
//! matrices), compiled as C++ with clang-19 and the Metal emulation header (`kernels/emu/`,
//! simdgroup matrices in metal_emu_simdgroup_matrix.h), run on the CPU for all six
//! `gated_delta_chunk_{in}_{st}` kernels with the host's split (full chunks of 64 through the
//! chunk kernel, the tail through the recurrence kernel, kernels/emu/gated_delta_chunk_harness.cpp)
//! and compared with the token-by-token CPU twin ([`gdn_ops::gated_delta_update_in`] in
//! [`gdn_ops::GdnForm::Recurrent`]).
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`, like the other emulation tests; it
//! never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates, per case (those of tests/metal_emulation.rs for the recurrence kernel):
//! - f32 state: the final state within 1e-5 of max |state| of the reference's;
//! - bf16 state: the kernel's bf16 state is exactly its f32-state sibling's state rounded once,
//!   that f32 state is within 1e-5 of the reference's, and the bf16 states agree bit for bit
//!   except at certified rounding-boundary straddles (at most 0.1% of a case's state);
//! - y: within one ulp of InT of the reference's y (itself rounded to InT), or 1e-5 of max
//!   |y|; exactly 0 at padded tokens.

mod common;
mod emu;
mod gated_delta_emu;

use common::gated_delta::INSTANTIATIONS;
use common::{St, Ty as In};
use gated_delta_emu::{
    assert_chunk_instantiations, assert_chunk_params, numbered, run_all, shape, Job, Kernel,
};
use gdn_ops::GdnForm;

static HARNESS: emu::Harness = emu::Harness::metal("gated_delta_chunk_harness");

/// The cases: every kernel at T in {1, 63, 64, 65, 200} (no chunk, a tail only, one chunk,
/// a chunk and a one-token tail, three chunks and a tail) on one 32-column block of a
/// 128-key head; padding masks; and the models' head shapes.
fn jobs() -> Vec<Job> {
    let mut jobs = vec![];
    for &(inp, st) in &INSTANTIATIONS {
        for t in [1, 63, 64, 65, 200] {
            jobs.push((inp, st, shape(1, t, 1, 2, 128, 32), false));
        }
        // Left padding in batch 0, scattered padding in batch 1, across a chunk boundary.
        jobs.push((inp, st, shape(2, 130, 1, 2, 128, 32), true));
    }
    for inp in [In::F32, In::Bf16] {
        // Qwen3-Next: Dk = Dv = 128, 16 key and 32 value heads (ratio 2).
        jobs.push((inp, St::F32, shape(1, 65, 1, 2, 128, 128), false));
        // Qwen3.5 (397B): 16 key and 64 value heads (ratio 4).
        jobs.push((inp, St::F32, shape(1, 64, 1, 4, 128, 128), false));
    }
    // mlx-lm's default Qwen3.5 head (Dk 192, Dv 128), and the largest key dim the kernel holds.
    jobs.push((In::F32, St::F32, shape(1, 64, 1, 2, 192, 128), false));
    jobs.push((In::F32, St::F32, shape(1, 64, 1, 1, 256, 32), false));
    numbered(jobs)
}

#[test]
fn shipped_kernel_matches_the_cpu_reference() {
    run_all(
        &Kernel {
            harness: &HARNESS,
            magic: b"GDCEMU01",
            name: "gated_delta_chunk",
            reference: Some(GdnForm::Recurrent),
        },
        jobs(),
    );
}

/// What the C++ build cannot see: the buffer indices (attributes, ignored by clang) and the
/// parameter struct the Rust host side mirrors.
#[test]
fn kernel_abi_in_source() {
    let src =
        std::fs::read_to_string(emu::workspace_root().join("kernels/gated_delta_chunk.metal"))
            .unwrap();
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = squash(&src);
    assert_chunk_params();
    assert!(
        flat.contains("#include \"params/gated_delta_chunk.h\""),
        "gated_delta_chunk.metal must take GdnChunkParams from kernels/params/gated_delta_chunk.h"
    );
    // Each pass's buffers in metal_chunked.rs's binding order, the params after them.
    for (kernel, buffers) in [
        (
            "#define GDN_CHUNK_PREP_KERNEL(",
            &["k", "v", "g", "beta", "mask", "gcum", "w", "u", "p"][..],
        ),
        (
            "#define GDN_CHUNK_STATE_KERNEL(",
            &["k", "gcum", "w", "u", "h", "state", "p"][..],
        ),
        (
            "#define GDN_CHUNK_OUT_KERNEL(",
            &["q", "k", "gcum", "h", "v_new", "mask", "y", "p"][..],
        ),
    ] {
        emu::assert_buffers(&flat, kernel, buffers);
    }
    assert_chunk_instantiations(&flat, "KERNEL", |n| match n {
        "f32" => "float",
        "f16" => "half",
        _ => "bfloat",
    });
}
