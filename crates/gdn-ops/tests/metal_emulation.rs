//! The shipped Metal kernel, `kernels/gated_delta.metal`, compiled as C++ with clang-19 and a
//! small Metal emulation header (`kernels/emu/`), run on the CPU for all six
//! `gated_delta_step_{in}_{st}` kernels and compared with the Rust reference
//! [`gdn_ops::gated_delta_update_masked`].
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev` (the harness links with
//! `--rtlib=compiler-rt`, for bf16 conversions that libgcc 12 lacks). Without them this test
//! fails; it never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates, per case:
//! - f32 state: the final state within 1e-5 of max |state| of the reference's;
//! - bf16 state: bit-for-bit the reference's bf16 state, except where the reference's and the
//!   kernel's f32 results (before the one rounding) lie on either side of a bf16 rounding
//!   boundary. That exception is certified, not assumed: the kernel's f32-state sibling is
//!   run on the same inputs, its state must match the reference's f32 state within 1e-5, and
//!   the bf16 kernel's state must be exactly that f32 state rounded once to bf16. Such ties
//!   must stay rare (at most 0.1% of a case's state; about a dozen in the whole run);
//! - y: within one ulp of InT of the reference's y (itself rounded to InT), or 1e-5 of max
//!   |y|; exactly 0 at padded tokens.

mod common;
mod emu;
mod gated_delta_emu;

use common::gated_delta::INSTANTIATIONS;
use gated_delta_emu::{run_all, shape, Job, Kernel};

static HARNESS: emu::Harness = emu::Harness::metal("gated_delta_harness");

/// The cases: every kernel at T in {1, 7, 64}, GQA ratios 1, 2 and 4, Dk 64 and 128, with and
/// without padding; each T and each ratio meets every Dv, 6 among them (not a multiple of 4: a
/// threadgroup with idle rows).
fn jobs() -> Vec<Job> {
    let mut jobs = vec![];
    for (ii, &(inp, st)) in INSTANTIATIONS.iter().enumerate() {
        for (ti, &t) in [1usize, 7, 64].iter().enumerate() {
            for (ri, &ratio) in [1usize, 2, 4].iter().enumerate() {
                for &dk in &[64usize, 128] {
                    for masked in [false, true] {
                        let dv = [8, 6, 16][(ti + ri) % 3];
                        let seed =
                            ((ii * 3 + ti) * 3 + ri) as u64 * 1000 + dk as u64 + masked as u64;
                        let shape = shape(2, t, 2, ratio, dk, dv);
                        jobs.push(Job {
                            inp,
                            st,
                            shape,
                            masked,
                            seed,
                        });
                    }
                }
            }
        }
    }
    jobs
}

#[test]
fn shipped_kernel_matches_the_cpu_reference() {
    run_all(
        &Kernel {
            harness: &HARNESS,
            magic: b"GDNEMU01",
            name: "gated_delta_step",
            reference: None,
        },
        jobs(),
    );
}

/// What the C++ build cannot see: the buffer indices (attributes, ignored by clang) and the
/// parameter struct the Rust host side mirrors.
#[test]
fn kernel_abi_in_source() {
    let src =
        std::fs::read_to_string(emu::workspace_root().join("kernels/gated_delta.metal")).unwrap();
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = squash(&src);
    emu::assert_params(
        "gated_delta.h",
        "GdnParams",
        &[
            "batch",
            "steps",
            "key_heads",
            "value_heads",
            "key_dim",
            "value_dim",
            "has_mask",
        ],
    );
    assert!(
        flat.contains("#include \"params/gated_delta.h\""),
        "gated_delta.metal must take GdnParams from kernels/params/gated_delta.h"
    );
    emu::assert_buffers(
        &flat,
        "#define GDN_KERNEL(",
        &["q", "k", "v", "g", "beta", "state", "y", "mask", "p"],
    );
    for (inp, st) in INSTANTIATIONS {
        let ty = |n: &str| match n {
            "f32" => "float",
            "f16" => "half",
            _ => "bfloat",
        };
        let line = format!(
            "GDN_KERNEL(gated_delta_step_{}_{}, {}, {})",
            inp.name(),
            st.name(),
            ty(inp.name()),
            ty(st.name())
        );
        assert!(flat.contains(&line), "missing `{line}`");
    }
}
