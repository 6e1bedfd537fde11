//! The shipped `kernels/add_rms_norm.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for `add_rms_norm_{f32,f16,bf16}` and
//! compared with the CPU twin, [`gdn_ops::ops::add_rms_norm::add_rms_norm`].
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

use common::{close, failures, tensor, values, Input, Rng, Ty, TYPES};
use gdn_ops::ops::add_rms_norm::{add_rms_norm, row_threads, AddRmsNormParams};

static HARNESS: emu::Harness = emu::Harness::metal("add_rms_norm_harness");

struct Case {
    ty: Ty,
    rows: usize,
    cols: usize,
    delta: bool,
    seed: u64,
}

fn check(c: &Case) -> Option<String> {
    let mut rng = Rng::new(c.seed);
    let n = c.rows * c.cols;
    let residual = rng.values(n, -4.0, 4.0, c.ty);
    let delta = if c.delta {
        rng.values(n, -4.0, 4.0, c.ty)
    } else {
        vec![]
    };
    let weight = rng.values(c.cols, 0.5, 1.5, c.ty);
    let eps = 1e-6;
    let mut input = Input::new(b"ARMSEMU1");
    input
        .u32(c.ty.code())
        .u32(c.rows as u32)
        .u32(c.cols as u32)
        .u32(c.delta as u32)
        .f32(eps)
        .u32(row_threads(c.cols) as u32)
        .f32s(&residual)
        .f32s(&delta)
        .f32s(&weight);
    let got = match HARNESS.run(&input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let shape = [c.rows, c.cols];
    let r = tensor(&residual, &shape, c.ty);
    let d = c.delta.then(|| tensor(&delta, &shape, c.ty));
    let w = tensor(&weight, &[c.cols], c.ty);
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
    let mut cases = vec![];
    let mut seed = 0;
    // Qwen3-Next-80B-A3B (H = 2048), the widest row, rows not a multiple of 32 wide, one column.
    for (rows, cols) in [
        (1, 2048),
        (3, 200),
        (2, 8192),
        (4, 1),
        (5, 64),
        (2, 33),
        (1, 2600),
    ] {
        for ty in TYPES {
            for delta in [true, false] {
                seed += 1;
                cases.push(Case {
                    ty,
                    rows,
                    cols,
                    delta,
                    seed: seed * 7919,
                });
            }
        }
    }
    HARNESS.path();
    let failures: Vec<String> = failures(&cases, |c| {
        check(c).map(|e| {
            format!(
                "add_rms_norm_{} N={} H={} delta={}: {e}",
                c.ty.name(),
                c.rows,
                c.cols,
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
    let src = emu::shipped_source("kernels/add_rms_norm.metal");
    assert!(src.contains("#include \"params/add_rms_norm.h\""));
    for (i, name) in ["residual", "delta", "weight", "sum", "normed"]
        .iter()
        .enumerate()
    {
        assert!(
            src.contains(&format!("{name} [[buffer({i})]]")),
            "add_rms_norm.metal: {name} must be buffer {i}"
        );
    }
    assert!(src.contains("AddRmsNormParams& p [[buffer(5)]]"));
    for t in ["f32", "f16", "bf16"] {
        assert!(
            src.contains(&format!("(add_rms_norm_{t},")),
            "missing add_rms_norm_{t}"
        );
    }
    let cu = emu::shipped_source("kernels/add_rms_norm.cu");
    assert!(cu.contains("#include \"params/add_rms_norm.h\""));
}
