//! The shipped `kernels/moe_combine.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for every `moe_combine_<in>`
//! instantiation and compared with the CPU twin (`gdn_ops::ops::moe_combine`, on the same
//! rounded inputs), in both forms: the decode step's (slots in order, residual, norm) and the
//! prefill's (`moe_combine_rows`: rows gathered through a permutation, no residual, no norm).
//!
//! Gates: f32 within 1e-5 of max|twin| per output; f16 and bf16 within 1 ulp of the dtype at
//! the twin's value (the twin rounds where the kernel does, from f32 values that differ only
//! in summation order), plus 1e-6 of max|twin|. The harness guards every buffer (see
//! kernels/emu/guarded_buffer.h).

mod common;
mod emu;

use candle_core::{DType, Device, Tensor};
use common::{failures, values, Input, Rng, TYPES};
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

/// A random permutation of `0..n`.
fn permutation(rng: &mut Rng, n: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        p.swap(i, rng.below(i + 1));
    }
    p
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
        let dt = TYPES[dtype].dtype();
        Self {
            dtype,
            tokens,
            slots,
            hidden,
            eps: 1e-6,
            down: rng.tensor_as(&[tokens, slots, hidden], -2.0, 2.0, dt),
            rows: None,
            weights: rng.tensor_as(&[tokens, slots], 0.0, 0.5, DType::F32),
            residual: Some(rng.tensor_as(&[tokens, hidden], -4.0, 4.0, dt)),
            norm_weight: norm.then(|| rng.tensor_as(&[hidden], 0.5, 1.5, dt)),
        }
    }

    /// The prefill form: `tokens · slots` expert outputs in a random (grouped) order, plus
    /// `spare` rows no slot names.
    fn gathered(
        seed: u64,
        dtype: usize,
        tokens: usize,
        slots: usize,
        hidden: usize,
        spare: usize,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let dt = TYPES[dtype].dtype();
        let pairs = tokens * slots;
        let order = permutation(&mut rng, pairs + spare);
        let rows =
            Tensor::from_vec(order[..pairs].to_vec(), (tokens, slots), &Device::Cpu).unwrap();
        Self {
            dtype,
            tokens,
            slots,
            hidden,
            eps: 1e-6,
            down: rng.tensor_as(&[pairs + spare, hidden], -2.0, 2.0, dt),
            rows: Some(rows),
            weights: rng.tensor_as(&[tokens, slots], 0.0, 0.5, DType::F32),
            residual: None,
            norm_weight: None,
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

fn cases() -> Vec<Case> {
    let mut out = vec![];
    let mut next = common::seeds(7_919);
    for dt in 0..3 {
        // Qwen3-Next-80B: H = 2048, k = 10 routed + the shared slot.
        out.push(Case::new(next(), dt, 2, 11, 2048, true));
        // H not a multiple of 32; one slot; no norm.
        out.push(Case::new(next(), dt, 3, 9, 200, true));
        out.push(Case::new(next(), dt, 1, 1, 77, true));
        out.push(Case::new(next(), dt, 4, 5, 256, false));
        out.push(Case::new(next(), dt, 1, 3, 16, false));
        // Wider than a threadgroup's registers (4 × 512 columns): the columns in turns.
        out.push(Case::new(next(), dt, 1, 2, 2100, true));
        // The prefill form: a permutation of the pairs, with and without spare rows.
        out.push(Case::gathered(next(), dt, 3, 11, 2048, 0));
        out.push(Case::gathered(next(), dt, 7, 4, 200, 5));
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
    let flat = emu::shipped_source("kernels/moe_combine.metal");
    assert!(flat.contains("#include \"params/moe_combine.h\""));
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
