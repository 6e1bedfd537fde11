//! The shipped `kernels/moe_route.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for every `moe_route_<in>` instantiation
//! and compared with the CPU twin (`gdn_ops::ops::moe_route`, on the same rounded logits), over
//! the op's cases (tests/common/moe_route.rs).
//!
//! Gates, per case: ids equal to the twin's, slot for slot (the selection rule, ties by the
//! lower index included); weights within 1e-5 of the twin's (they are at most 1, and the two
//! differ only in the order of the softmax denominator's sum and in exp's last bits).
//! The harness guards every buffer (see kernels/emu/guarded_buffer.h).

mod common;
mod emu;

use candle_core::Tensor;
use common::moe_route::{cases as op_cases, Case as OpCase};
use common::{failures, values, Input, TYPES};
use gdn_ops::ops::moe_route::{moe_route, MoeRouteParams};

static HARNESS: emu::Harness = emu::Harness::metal("moe_route_harness");

struct Case {
    dtype: usize,
    tokens: usize,
    experts: usize,
    top_k: usize,
    renormalise: bool,
    has_shared: bool,
    /// Rounded to the dtype.
    logits: Tensor,
}

impl Case {
    /// Case `i` of the op's cases in `TYPES[dtype]`.
    fn new(i: usize, c: OpCase, dtype: usize) -> Self {
        Self {
            dtype,
            tokens: c.tokens,
            experts: c.experts,
            top_k: c.top_k,
            renormalise: c.renormalise,
            has_shared: c.has_shared,
            logits: c.logits(i, TYPES[dtype].dtype()),
        }
    }

    fn label(&self) -> String {
        format!(
            "moe_route_{} N={} E={} k={} renormalise={} shared={}",
            TYPES[self.dtype].name(),
            self.tokens,
            self.experts,
            self.top_k,
            self.renormalise,
            self.has_shared
        )
    }

    fn run(&self) -> Result<(Vec<u32>, Vec<f32>), String> {
        let mut input = Input::new(b"ROUTEMU1");
        for h in [
            self.dtype,
            self.tokens,
            self.experts,
            self.top_k,
            self.renormalise as usize,
            self.has_shared as usize,
        ] {
            input.u32(h as u32);
        }
        input.f32s(&values(&self.logits));
        let out = HARNESS.run(&input.0)?;
        let n = self.tokens * (self.top_k + self.has_shared as usize);
        if out.len() != 2 * n {
            return Err(format!(
                "harness wrote {} values, expected {}",
                out.len(),
                2 * n
            ));
        }
        Ok((
            out[..n].iter().map(|f| f.to_bits()).collect(),
            out[n..].to_vec(),
        ))
    }

    fn check(&self) -> Option<String> {
        let (ids, weights) = match self.run() {
            Ok(r) => r,
            Err(e) => return Some(e),
        };
        let (want_ids, want_w) =
            moe_route(&self.logits, self.top_k, self.renormalise, self.has_shared).unwrap();
        let want_ids: Vec<u32> = want_ids.flatten_all().unwrap().to_vec1().unwrap();
        let want_w: Vec<f32> = want_w.flatten_all().unwrap().to_vec1().unwrap();
        if ids != want_ids {
            return Some(format!("ids {ids:?}, twin {want_ids:?}"));
        }
        for (i, (g, w)) in weights.iter().zip(&want_w).enumerate() {
            if (g - w).abs() > 1e-5 || g.is_nan() {
                return Some(format!("weights[{i}] = {g:e}, twin {w:e}"));
            }
        }
        None
    }
}

/// The op's cases (tests/common/moe_route.rs) at every dtype.
fn cases() -> Vec<Case> {
    let mut out = vec![];
    for (i, c) in op_cases().into_iter().enumerate() {
        out.extend((0..3).map(|dt| Case::new(i, c, dt)));
    }
    out
}

#[test]
fn shipped_moe_route_kernels_match_the_cpu_twin() {
    HARNESS.path();
    let jobs = cases();
    for dt in 0..3 {
        assert!(jobs.iter().any(|c| c.dtype == dt));
    }
    let failures: Vec<String> =
        failures(&jobs, |c| c.check().map(|e| format!("[{}] {e}", c.label())));
    common::assert_no_failures(&failures, jobs.len(), "cases disagree with the twin");
}

/// What the C++ build cannot see: buffer indices, the parameter struct, the names.
#[test]
fn moe_route_abi_in_source() {
    emu::assert_params(
        "moe_route.h",
        "MoeRouteParams",
        &["tokens", "experts", "top_k", "renormalise", "has_shared"],
    );
    assert_eq!(std::mem::size_of::<MoeRouteParams>(), 5 * 4);
    let flat = emu::shipped_source_including("kernels/moe_route.metal", "moe_route.h");
    emu::assert_buffers(
        &flat,
        "#define MOE_ROUTE(",
        &["logits", "ids", "weights", "p"],
    );
    for (tag, msl) in TYPES.map(|t| (t.name(), t.msl())) {
        let line = format!("MOE_ROUTE(moe_route_{tag}, {msl})");
        assert!(flat.contains(&line), "missing `{line}`");
    }
    assert!(
        flat.contains("#if defined(__HAVE_BFLOAT__) MOE_ROUTE(moe_route_bf16, bfloat) #endif"),
        "the bfloat instantiation must be guarded"
    );
}
