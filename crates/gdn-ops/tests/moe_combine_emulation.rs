//! The shipped `kernels/moe_combine.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for every `moe_combine_<in>`
//! instantiation and compared with the CPU twin (`gdn_ops::ops::moe_combine`, on the same
//! rounded inputs).
//!
//! Gates: f32 within 1e-5 of max|twin| per output; f16 and bf16 within 1 ulp of the dtype at
//! the twin's value (the twin rounds where the kernel does, from f32 values that differ only
//! in summation order), plus 1e-6 of max|twin|. The harness guards every buffer (see
//! kernels/emu/guarded_buffer.h).

mod common;
mod emu;

use candle_core::{DType, Tensor};
use common::{failures, values, Input, Rng};
use gdn_ops::ops::moe_combine::{moe_combine, MoeCombineParams};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const DTYPES: [(DType, &str, &str); 3] = [
    (DType::F32, "f32", "float"),
    (DType::F16, "f16", "half"),
    (DType::BF16, "bf16", "bfloat"),
];

fn harness() -> &'static Path {
    static HARNESS: OnceLock<PathBuf> = OnceLock::new();
    HARNESS.get_or_init(|| emu::compile_harness("moe_combine_harness", &[]))
}

struct Case {
    dtype: usize,
    tokens: usize,
    slots: usize,
    hidden: usize,
    eps: f32,
    down: Tensor,
    weights: Tensor,
    residual: Tensor,
    norm_weight: Option<Tensor>,
}

impl Case {
    fn new(
        seed: u64,
        dtype: usize,
        tokens: usize,
        slots: usize,
        hidden: usize,
        norm: bool,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let dt = DTYPES[dtype].0;
        Self {
            dtype,
            tokens,
            slots,
            hidden,
            eps: 1e-6,
            down: rng.tensor_as(&[tokens, slots, hidden], -2.0, 2.0, dt),
            weights: rng.tensor_as(&[tokens, slots], 0.0, 0.5, DType::F32),
            residual: rng.tensor_as(&[tokens, hidden], -4.0, 4.0, dt),
            norm_weight: norm.then(|| rng.tensor_as(&[hidden], 0.5, 1.5, dt)),
        }
    }

    fn label(&self) -> String {
        format!(
            "moe_combine_{} N={} S={} H={} norm={}",
            DTYPES[self.dtype].1,
            self.tokens,
            self.slots,
            self.hidden,
            self.norm_weight.is_some()
        )
    }

    fn check(&self) -> Option<String> {
        let mut input = Input::new(b"COMBEMU1");
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
        let inputs = [&self.down, &self.weights, &self.residual]
            .into_iter()
            .chain(&self.norm_weight);
        for t in inputs {
            input.f32s(&values(t));
        }
        let out = match emu::run_harness(harness(), &input.0) {
            Ok(o) => o,
            Err(e) => return Some(e),
        };
        let (sum, normed) = moe_combine(
            &self.down,
            &self.weights,
            &self.residual,
            self.norm_weight.as_ref().map(|w| (w, self.eps)),
        )
        .unwrap();
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
                let ulp = match DTYPES[self.dtype].0 {
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

fn cases() -> Vec<Case> {
    let mut out = vec![];
    let mut seed = 0u64;
    let mut next = || {
        seed += 1;
        seed * 7_919
    };
    for dt in 0..3 {
        // Qwen3-Next-80B: H = 2048, k = 10 routed + the shared slot.
        out.push(Case::new(next(), dt, 2, 11, 2048, true));
        // H not a multiple of 32; one slot; no norm.
        out.push(Case::new(next(), dt, 3, 9, 200, true));
        out.push(Case::new(next(), dt, 1, 1, 77, true));
        out.push(Case::new(next(), dt, 4, 5, 256, false));
        out.push(Case::new(next(), dt, 1, 3, 16, false));
    }
    out
}

#[test]
fn shipped_moe_combine_kernels_match_the_cpu_twin() {
    harness();
    let jobs = cases();
    let failures: Vec<String> =
        failures(&jobs, |c| c.check().map(|e| format!("[{}] {e}", c.label())));
    common::assert_no_failures(&failures, jobs.len(), "cases disagree with the twin");
}

/// What the C++ build cannot see: buffer indices, the parameter struct, the names.
#[test]
fn moe_combine_abi_in_source() {
    let fields = emu::params_fields("moe_combine.h", "MoeCombineParams");
    let want: Vec<(String, String)> = [
        ("unsigned int", "tokens"),
        ("unsigned int", "slots"),
        ("unsigned int", "hidden"),
        ("unsigned int", "has_norm"),
        ("float", "eps"),
    ]
    .iter()
    .map(|(t, f)| (t.to_string(), f.to_string()))
    .collect();
    assert_eq!(fields, want);
    assert_eq!(std::mem::size_of::<MoeCombineParams>(), 5 * 4);
    let flat = emu::shipped_source("kernels/moe_combine.metal");
    assert!(flat.contains("#include \"params/moe_combine.h\""));
    emu::assert_buffers(
        &flat,
        "#define MOE_COMBINE(",
        &[
            "down",
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
    for (_, tag, msl) in DTYPES {
        let line = format!("MOE_COMBINE(moe_combine_{tag}, {msl})");
        assert!(flat.contains(&line), "missing `{line}`");
    }
    assert!(
        flat.contains("#if defined(__HAVE_BFLOAT__) MOE_COMBINE(moe_combine_bf16, bfloat) #endif"),
        "the bfloat instantiation must be guarded"
    );
}
