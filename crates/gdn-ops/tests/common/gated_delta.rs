//! The gated delta rule's inputs, generated in one place for every backend's test (the Metal
//! and CUDA emulation tests of the recurrence, the chunked form and the fused norm): the six
//! kernel instantiations, unit-norm keys, decays, betas, a state exact in its dtype, and the
//! padding mask.

use super::compare::rel_err;
use super::dtype::{St, Ty};
use super::random::Rng;
use half::bf16;

/// Every (input, state) dtype pair a gated-delta kernel is instantiated for.
pub const INSTANTIATIONS: [(Ty, St); 6] = [
    (Ty::F32, St::F32),
    (Ty::F32, St::Bf16),
    (Ty::F16, St::F32),
    (Ty::F16, St::Bf16),
    (Ty::Bf16, St::F32),
    (Ty::Bf16, St::Bf16),
];

/// Batch, tokens, key and value heads, key and value dims.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnDims {
    /// (B, T, Hk, Hv, Dk, Dv).
    pub const fn new(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> Self {
        Self {
            b,
            t,
            hk,
            hv,
            dk,
            dv,
        }
    }
    /// (B, T, Hk, Hv, Dk, Dv).
    pub fn tuple(&self) -> (usize, usize, usize, usize, usize, usize) {
        (self.b, self.t, self.hk, self.hv, self.dk, self.dv)
    }
}

/// One call's inputs as f32 values, each exact in the dtype it is fed in: q, k and v in the
/// input type, g and beta in f32, the state in the state type.
pub struct GdnInputs {
    /// `[B, T, Hk, Dk]`, rows of norm 1/√Dk.
    pub q: Vec<f32>,
    /// `[B, T, Hk, Dk]`, rows of norm 1.
    pub k: Vec<f32>,
    /// `[B, T, Hv, Dv]`.
    pub v: Vec<f32>,
    /// `[B, T, Hv]` decays in [0.6, 1], some exactly 1.
    pub g: Vec<f32>,
    /// `[B, T, Hv]` in [0.05, 0.95].
    pub beta: Vec<f32>,
    /// `[B, Hv, Dv, Dk]`.
    pub state: Vec<f32>,
}

/// Draws one call's inputs from `rng`, in this order: q, k, v, g, beta, state (a test that
/// draws more, a mask or a gate, draws it after).
pub fn gdn_inputs(rng: &mut Rng, inp: Ty, st: St, d: GdnDims) -> GdnInputs {
    let (b, t, hk, hv, dk, dv) = d.tuple();
    // Unit-norm keys, as the model feeds them: (I - beta k k^T) then contracts, and long
    // sequences stay bounded. q carries the 1/sqrt(Dk) scale.
    let mut unit_rows = |scale: f32| -> Vec<f32> {
        let mut x: Vec<f32> = (0..b * t * hk * dk)
            .map(|_| rng.signed(0.05, 1.0))
            .collect();
        for row in x.chunks_exact_mut(dk) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut()
                .for_each(|v| *v = inp.round(*v / norm * scale));
        }
        x
    };
    let q = unit_rows(1.0 / (dk as f32).sqrt());
    let k = unit_rows(1.0);
    let v = (0..b * t * hv * dv)
        .map(|_| inp.round(rng.signed(0.05, 1.0)))
        .collect();
    // Decays in [0.6, 1], some exactly 1 (no decay).
    let g = (0..b * t * hv)
        .map(|_| {
            if rng.next() & 7 == 0 {
                1.0
            } else {
                rng.uniform(0.6, 1.0)
            }
        })
        .collect();
    let beta = (0..b * t * hv).map(|_| rng.uniform(0.05, 0.95)).collect();
    let state = (0..b * hv * dv * dk)
        .map(|_| {
            let x = rng.signed(0.05, 1.0);
            match st {
                St::F32 => x,
                St::Bf16 => bf16::from_f32(x).to_f32(),
            }
        })
        .collect();
    GdnInputs {
        q,
        k,
        v,
        g,
        beta,
        state,
    }
}

/// A `[B, T]` padding mask (B >= 2): batch 0 left-padded over its first third, batch 1 with
/// scattered padding (T = 1: only batch 0 is padding).
pub fn padding_mask(rng: &mut Rng, b: usize, t: usize) -> Vec<f32> {
    let mut m = vec![1f32; b * t];
    m[..t.div_ceil(3)].fill(0.0);
    for x in &mut m[t + 1..] {
        if rng.next() & 3 == 0 {
            *x = 0.0;
        }
    }
    m
}

/// The gate every GDN kernel test puts on an f32 state: within `tol` of max |S| of the
/// reference's.
pub fn f32_state_gate(got: &[f32], want: &[f32], tol: f32) -> Option<String> {
    let (e, at) = rel_err(got, want);
    (e > tol).then(|| {
        format!(
            "f32 state[{at}] = {} vs reference {}: {e:.3e} of max|S| > {tol:e}",
            got[at], want[at]
        )
    })
}

/// The gates every GDN kernel test puts on a bf16 state through the kernel's own f32-state
/// sibling (run on the same inputs): the sibling's state `got32` within `tol` of max |S| of the
/// reference's f32 state `want32`, and the bf16 state `got` exactly `got32` rounded once.
/// Returns a description of each gate missed.
pub fn bf16_state_sibling_gates(
    got: &[f32],
    got32: &[f32],
    want32: &[f32],
    tol: f32,
) -> Vec<String> {
    let mut bad = vec![];
    let (e, at) = rel_err(got32, want32);
    if e > tol {
        bad.push(format!(
            "f32-state sibling: state[{at}] {e:.3e} of max|S| from the reference"
        ));
    }
    let round = |x: f32| bf16::from_f32(x).to_f32();
    let not_once = got
        .iter()
        .zip(got32)
        .filter(|(a, b)| a.to_bits() != round(**b).to_bits())
        .count();
    if not_once > 0 {
        bad.push(format!(
            "{not_once} bf16 state values are not the kernel's f32 state rounded once to bf16"
        ));
    }
    bad
}
