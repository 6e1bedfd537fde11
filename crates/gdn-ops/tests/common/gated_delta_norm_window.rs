//! `gated_delta_norm_window`'s cases and runs, shared by its CPU test
//! (tests/gated_delta_norm_window.rs) and its CUDA test (tests/cuda_gated_delta_norm_window.rs):
//! the window op over a case's T tokens, and what it must equal bit for bit, T one-token calls
//! of the plain op with the state copied after each (the per-token verify window).

use super::gated_delta::GdnDims;
use super::gated_delta_norm::{self, z_of, Shape};
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::gated_delta_norm::{gated_delta_update_norm, Gate};
use gdn_ops::ops::gated_delta_norm_window::gated_delta_update_norm_window;

/// The plain op's cases of two tokens or more (a window of one token keeps no state; the model
/// runs it on the plain op).
pub fn cases() -> Vec<Shape> {
    gated_delta_norm::cases()
        .into_iter()
        .filter(|c| c.d.t > 1)
        .collect()
}

/// What a run gives: the output `[B, T, Hv, Dv]` and the state after every token, the last
/// the advanced state itself.
pub struct Run {
    pub out: Tensor,
    pub states: Vec<Tensor>,
}

/// The inputs of [`gated_delta_norm::norm_tensors`] on `dev` (the state a copy: on the CPU
/// `to_device` shares storage, and a run advances it in place).
fn on(dev: &Device, x: &[Tensor; 8]) -> [Tensor; 8] {
    std::array::from_fn(|i| match i {
        5 => x[i].to_device(dev).unwrap().copy().unwrap(),
        _ => x[i].to_device(dev).unwrap(),
    })
}

/// The window op over the T tokens, in one call.
pub fn one_launch(dev: &Device, x: &[Tensor; 8], d: GdnDims, gate: Gate) -> Run {
    let [q, k, v, g, beta, state, proj, w] = on(dev, x);
    let z = z_of(&proj, d);
    let after = Tensor::zeros(
        (d.t - 1, d.b, d.hv, d.dv, d.dk),
        state.dtype(),
        state.device(),
    )
    .unwrap();
    let out =
        gated_delta_update_norm_window(&q, &k, &v, &g, &beta, &state, &z, &w, 1e-6, gate, &after)
            .unwrap();
    let mut states: Vec<Tensor> = (0..d.t - 1).map(|t| after.get(t).unwrap()).collect();
    states.push(state);
    Run { out, states }
}

/// T one-token calls of the plain op, the state copied after each: the per-token window.
pub fn per_token(dev: &Device, x: &[Tensor; 8], d: GdnDims, gate: Gate) -> Run {
    let [q, k, v, g, beta, state, proj, w] = on(dev, x);
    let z = z_of(&proj, d);
    let (mut outs, mut states) = (vec![], vec![]);
    for t in 0..d.t {
        let at = |x: &Tensor| x.narrow(1, t, 1).unwrap();
        let out = gated_delta_update_norm(
            &at(&q),
            &at(&k),
            &at(&v),
            &at(&g),
            &at(&beta),
            &state,
            &at(&z),
            &w,
            1e-6,
            gate,
        )
        .unwrap();
        outs.push(out);
        states.push(state.copy().unwrap());
    }
    Run {
        out: Tensor::cat(&outs, 1).unwrap(),
        states,
    }
}

/// A tensor's values as f32 bits (exact for f32, f16 and bf16).
pub fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

/// Where two runs differ, if they do: "out[i]" or "state after token t [i]", the first
/// differing value of each.
pub fn differences(got: &Run, want: &Run) -> Vec<String> {
    let mut bad = vec![];
    let mut compare = |name: String, a: &Tensor, b: &Tensor| {
        let (a, b) = (bits(a), bits(b));
        if a.len() != b.len() {
            bad.push(format!("{name}: {} values vs {}", a.len(), b.len()));
        } else if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            let n = (0..a.len()).filter(|&i| a[i] != b[i]).count();
            bad.push(format!(
                "{name}[{i}] = {} vs {} ({n} of {} values differ)",
                f32::from_bits(a[i]),
                f32::from_bits(b[i]),
                a.len()
            ));
        }
    };
    compare("out".into(), &got.out, &want.out);
    for (t, (a, b)) in got.states.iter().zip(&want.states).enumerate() {
        compare(format!("state after token {t}"), a, b);
    }
    bad
}
