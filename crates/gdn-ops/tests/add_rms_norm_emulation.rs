//! The shipped `kernels/add_rms_norm.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for `add_rms_norm_{f32,f16,bf16}` and
//! compared with the CPU twin, [`gdn_ops::ops::add_rms_norm::add_rms_norm`], over the op's
//! cases (tests/common/add_rms_norm.rs).
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`; without them this test fails, never
//! skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates, per case: `sum` bit for bit the twin's (one f32 add rounded once on both sides);
//! `normed` within 1 ulp of InT of the twin's plus 1e-5 of max |normed| (the f32 sum of
//! squares is added in another order). The harness guards every buffer and leaves the delta
//! and sum slots unbound without a delta.

mod common;
mod emu;

use common::add_rms_norm::{inputs, rows_cols, runs, seed};
use common::{close, failures, tensor, values, Input, Ty, TYPES};
use gdn_ops::ops::add_rms_norm::{add_rms_norm, row_threads, AddRmsNormParams};

static HARNESS: emu::Harness = emu::Harness::metal("add_rms_norm_harness");

/// One run of the op's cases (tests/common/add_rms_norm.rs).
struct Case {
    index: usize,
    shape: &'static [usize],
    ty: Ty,
    delta: bool,
}

fn check(c: &Case) -> Option<String> {
    let (rows, cols) = rows_cols(c.shape);
    let x = inputs(c.shape, c.ty, seed(c.index, c.ty));
    let delta = if c.delta { x.delta } else { vec![] };
    let eps = 1e-6;
    let mut input = Input::new(b"ARMSEMU1");
    input
        .u32(c.ty.code())
        .u32(rows as u32)
        .u32(cols as u32)
        .u32(c.delta as u32)
        .f32(eps)
        .u32(row_threads(cols) as u32)
        .f32s(&x.residual)
        .f32s(&delta)
        .f32s(&x.weight);
    let got = match HARNESS.run(&input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let n = rows * cols;
    let shape = [rows, cols];
    let r = tensor(&x.residual, &shape, c.ty);
    let d = c.delta.then(|| tensor(&delta, &shape, c.ty));
    let w = tensor(&x.weight, &[cols], c.ty);
    let (sum, normed) = add_rms_norm(&r, d.as_ref(), &w, eps).unwrap();
    let (want_normed, want_sum) = (values(&normed), values(&sum));
    let (got_normed, got_sum) = got.split_at(n.min(got.len()));
    close("normed", got_normed, &want_normed, c.ty, 1.0, 1e-5).or_else(|| {
        if c.delta {
            close("sum", got_sum, &want_sum, c.ty, 0.0, 0.0)
        } else {
            (!got_sum.is_empty()).then(|| "a sum was printed without a delta".to_string())
        }
    })
}

#[test]
fn shipped_add_rms_norm_kernels_match_the_cpu_twin() {
    let cases: Vec<Case> = runs(&TYPES)
        .into_iter()
        .map(|(index, shape, ty, delta)| Case {
            index,
            shape,
            ty,
            delta,
        })
        .collect();
    HARNESS.path();
    let failures: Vec<String> = failures(&cases, |c| {
        check(c).map(|e| {
            format!(
                "add_rms_norm_{} {:?} delta={}: {e}",
                c.ty.name(),
                c.shape,
                c.delta
            )
        })
    });
    common::assert_no_failures(&failures, cases.len(), "cases fail");
}

/// What the C++ build cannot see: the buffer indices, the parameter struct the host
/// mirrors, and the instantiation names.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "add_rms_norm.h",
        "AddRmsNormParams",
        &["rows", "cols", "has_delta", "float eps"],
    );
    assert_eq!(std::mem::size_of::<AddRmsNormParams>(), 16);
    let src = emu::shipped_source_including("kernels/add_rms_norm.metal", "add_rms_norm.h");
    let buffers = ["residual", "delta", "weight", "sum", "normed"];
    emu::assert_buffer_indices(&src, "add_rms_norm.metal", &buffers, "");
    assert!(src.contains("AddRmsNormParams& p [[buffer(5)]]"));
    emu::assert_instantiated(&src, "add_rms_norm");
    emu::shipped_source_including("kernels/add_rms_norm.cu", "add_rms_norm.h");
}
