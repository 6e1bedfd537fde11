//! The shipped `kernels/moe_combine.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for every `moe_combine_<in>`
//! instantiation and compared with the CPU twin (`gdn_ops::ops::moe_combine`, on the same
//! rounded inputs), in both forms: the decode step's (slots in order, residual, norm) and the
//! prefill's (`moe_combine_rows`: rows gathered through a permutation, no residual, no norm),
//! over the op's cases (tests/common/moe_combine.rs) up to the emulator's size bound.
//!
//! Gates: f32 within 1e-5 of max|twin| per output; f16 and bf16 within 1 ulp of the dtype at
//! the twin's value (the twin rounds where the kernel does, from f32 values that differ only
//! in summation order), plus 1e-6 of max|twin|. The harness guards every buffer (see
//! kernels/emu/guarded_buffer.h).

mod common;
mod emu;

use candle_core::{DType, Tensor};
use common::moe_combine::{cases as op_cases, Case as OpCase, EMULATION_MAX_VALUES};
use common::{failures, values, Input, TYPES};
use gdn_ops::ops::moe_combine::{combine_threads, moe_combine, moe_combine_rows, MoeCombineParams};

static HARNESS: emu::Harness = emu::Harness::metal("moe_combine_harness");

struct Case {
    dtype: usize,
    tokens: usize,
    slots: usize,
    hidden: usize,
    eps: f32,
    /// `[N, S, H]`, or `[P, H]` read through `rows`.
    down: Tensor,
    /// `[N, S]` u32: the prefill form's row of each slot in `down`.
    rows: Option<Tensor>,
    weights: Tensor,
    residual: Option<Tensor>,
    norm_weight: Option<Tensor>,
}

impl Case {
    /// Case `i` of the op's cases in `TYPES[dtype]`.
    fn new(i: usize, c: OpCase, dtype: usize) -> Self {
        let x = c.inputs(i, TYPES[dtype].dtype());
        Self {
            dtype,
            tokens: c.tokens,
            slots: c.slots,
            hidden: c.hidden,
            eps: 1e-6,
            down: x.down,
            rows: x.rows,
            weights: x.weights,
            residual: x.residual,
            norm_weight: x.norm_weight,
        }
    }

    fn label(&self) -> String {
        format!(
            "moe_combine_{} N={} S={} H={} norm={} gathered={}",
            TYPES[self.dtype].name(),
            self.tokens,
            self.slots,
            self.hidden,
            self.norm_weight.is_some(),
            self.rows.is_some()
        )
    }

    fn check(&self) -> Option<String> {
        let mut input = Input::new(b"COMBEMU2");
        for h in [
            self.dtype,
            self.tokens,
            self.slots,
            self.hidden,
            self.norm_weight.is_some() as usize,
        ] {
            input.u32(h as u32);
        }
        input.f32(self.eps);
        input.u32(self.residual.is_some() as u32);
        input.u32(self.rows.is_some() as u32);
        input.u32(self.rows.as_ref().map_or(0, |_| self.down.dim(0).unwrap()) as u32);
        input.u32(combine_threads(self.hidden) as u32);
        input.f32s(&values(&self.down));
        if let Some(rows) = &self.rows {
            for r in rows.flatten_all().unwrap().to_vec1::<u32>().unwrap() {
                input.u32(r);
            }
        }
        input.f32s(&values(&self.weights));
        for t in self.residual.iter().chain(&self.norm_weight) {
            input.f32s(&values(t));
        }
        let out = match HARNESS.run(&input.0) {
            Ok(o) => o,
            Err(e) => return Some(e),
        };
        let (sum, normed) = match (&self.rows, &self.residual) {
            (Some(rows), None) => (
                moe_combine_rows(&self.down, rows, &self.weights).unwrap(),
                None,
            ),
            (None, Some(residual)) => moe_combine(
                &self.down,
                &self.weights,
                residual,
                self.norm_weight.as_ref().map(|w| (w, self.eps)),
            )
            .unwrap(),
            _ => unreachable!("the two forms: gathered without a residual, or in order with one"),
        };
        let mut want = values(&sum);
        if let Some(n) = &normed {
            want.extend(values(n));
        }
        if out.len() != want.len() {
            return Some(format!(
                "harness wrote {} values, expected {}",
                out.len(),
                want.len()
            ));
        }
        let rows = self.tokens * self.hidden;
        for (part, range) in [("sum", 0..rows), ("normed", rows..want.len())] {
            let max = want[range.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
            for i in range {
                let (g, w) = (out[i], want[i]);
                let ulp = match TYPES[self.dtype].dtype() {
                    DType::F32 => 1e-5 * max,
                    DType::F16 => w.abs().max(6.1e-5) * 2f32.powi(-10) + 1e-6 * max,
                    _ => w.abs().max(1e-30) * 2f32.powi(-7) + 1e-6 * max,
                };
                if (g - w).abs() > ulp || g.is_nan() {
                    let at = if part == "sum" { i } else { i - rows };
                    return Some(format!(
                        "{part}[{at}] = {g:e}, twin {w:e} (allowed {ulp:e})"
                    ));
                }
            }
        }
        None
    }
}

/// The op's cases (tests/common/moe_combine.rs) the emulator runs in time
/// ([`EMULATION_MAX_VALUES`]), at every dtype.
fn cases() -> Vec<Case> {
    let mut out = vec![];
    for (i, c) in op_cases().into_iter().enumerate() {
        if c.tokens * c.slots * c.hidden <= EMULATION_MAX_VALUES {
            out.extend((0..3).map(|dt| Case::new(i, c, dt)));
        }
    }
    out
}

#[test]
fn shipped_moe_combine_kernels_match_the_cpu_twin() {
    HARNESS.path();
    let jobs = cases();
    let failures: Vec<String> =
        failures(&jobs, |c| c.check().map(|e| format!("[{}] {e}", c.label())));
    common::assert_no_failures(&failures, jobs.len(), "cases disagree with the twin");
}

/// What the C++ build cannot see: buffer indices, the parameter struct, the names.
#[test]
fn moe_combine_abi_in_source() {
    emu::assert_params(
        "moe_combine.h",
        "MoeCombineParams",
        &[
            "tokens",
            "slots",
            "hidden",
            "has_norm",
            "float eps",
            "has_residual",
            "gathered",
            "down_rows",
        ],
    );
    assert_eq!(std::mem::size_of::<MoeCombineParams>(), 8 * 4);
    let flat = emu::shipped_source_including("kernels/moe_combine.metal", "moe_combine.h");
    emu::assert_buffers(
        &flat,
        "#define MOE_COMBINE(",
        &[
            "down",
            "rows",
            "weights",
            "residual",
            "norm_weight",
            "sum",
            "normed",
            "p",
        ],
    );
    assert!(
        flat.contains("threadgroup float* scratch [[threadgroup(0)]]"),
        "the host sets threadgroup memory at index 0"
    );
    for (tag, msl) in TYPES.map(|t| (t.name(), t.msl())) {
        let line = format!("MOE_COMBINE(moe_combine_{tag}, {msl})");
        assert!(flat.contains(&line), "missing `{line}`");
    }
    assert!(
        flat.contains("#if defined(__HAVE_BFLOAT__) MOE_COMBINE(moe_combine_bf16, bfloat) #endif"),
        "the bfloat instantiation must be guarded"
    );
}
