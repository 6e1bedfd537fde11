//! The shipped Metal window entries `gated_delta_norm_window_{in}_{st}`
//! (kernels/gated_delta_norm.metal), compiled as C++ with clang-19 and the Metal emulation
//! header (`kernels/emu/gated_delta_norm_window_harness.cpp`), over the op's cases of two
//! tokens or more (tests/common/gated_delta_norm_window.rs), all six instantiations, z a
//! strided view with NaN between its tokens, the gate silu and sigmoid on alternate cases:
//!
//! - **bit for bit** T one-token launches of the plain entries `gated_delta_norm_{in}_{st}` on
//!   the same emulation (the output and the state after every token): the per-token window;
//! - against the CPU twin (`gated_delta_update_norm_window` on the CPU) with the plain
//!   kernel's emulation gates (tests/gated_delta_norm_emulation.rs) for an f32 state: the
//!   output within two ulps of InT or 1e-5 of max |out|, the states within 1e-5 of max |S|;
//!   with a bf16 state (rounded after every token on both sides, so a rounding tie carries
//!   into later tokens) the CUDA tests' gate: 8e-3 of max |S|, the output twice that.

mod common;
mod emu;

use candle_core::{DType, Tensor};
use common::gated_delta::{f32_state_gate, gdn_inputs, GdnDims, INSTANTIATIONS};
use common::gated_delta_norm::Shape;
use common::gated_delta_norm_window::cases;
use common::{max_abs, rel_err, tensor_as, values, worst_excess, Input, Rng, St, Ty as In};
use gdn_ops::ops::gated_delta_norm::Gate;
use gdn_ops::ops::gated_delta_norm_window::gated_delta_update_norm_window;

static HARNESS: emu::Harness = emu::Harness::metal("gated_delta_norm_window_harness");

const REL_TOL: f32 = 1e-5;
/// A bf16 state's gate against the twin, of max |want|: the CUDA tests' bf16 tolerance.
const BF16_STATE_TOL: f32 = 8e-3;

/// A case's f32 inputs (each exact in its dtype) and z's strides.
struct Case {
    s: Shape,
    inp: In,
    st: St,
    gate: Gate,
    z_strides: (usize, usize),
    /// q, k, v, g, beta, state, z (a strided view's storage, NaN in the gaps), weight.
    arrays: [Vec<f32>; 8],
}

fn make_case(s: Shape, inp: In, st: St, gate: Gate, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let GdnDims { b, t, hv, dv, .. } = s.d;
    let x = gdn_inputs(&mut rng, inp, st, s.d);
    let row = hv * dv;
    let z_strides = ((t + 1) * (row + 3), row + 3);
    let mut z = vec![f32::NAN; (b - 1) * z_strides.0 + (t - 1) * z_strides.1 + row];
    for bi in 0..b {
        for ti in 0..t {
            let at = bi * z_strides.0 + ti * z_strides.1;
            for x in &mut z[at..at + row] {
                *x = inp.round(rng.uniform(-6.0, 6.0));
            }
        }
    }
    let weight = (0..dv).map(|_| inp.round(rng.uniform(0.5, 1.5))).collect();
    Case {
        s,
        inp,
        st,
        gate,
        z_strides,
        arrays: [x.q, x.k, x.v, x.g, x.beta, x.state, z, weight],
    }
}

/// What the harness gives: the window launch's (out, the state after every token) and the
/// one-token launches'.
struct Runs {
    window: (Vec<f32>, Vec<f32>),
    per_token: (Vec<f32>, Vec<f32>),
}

fn run_harness(c: &Case) -> Result<Runs, String> {
    let s = c.s.d;
    let mut input = Input::new(b"GDNWEMU1");
    for h in [
        s.b,
        s.t,
        s.hk,
        s.hv,
        s.dk,
        s.dv,
        c.inp as usize,
        c.st as usize,
        c.s.simdgroups,
        c.z_strides.0,
        c.z_strides.1,
        usize::from(c.gate == Gate::Sigmoid),
    ] {
        input.u32(h as u32);
    }
    input.f32(1e-6);
    for a in &c.arrays {
        input.f32s(a);
    }
    let floats = HARNESS.run(&input.0)?;
    let (out, state) = (s.b * s.t * s.hv * s.dv, s.b * s.hv * s.dv * s.dk);
    let [w_out, mut w_after, w_state, p_out, p_states] =
        emu::split_output(floats, [out, (s.t - 1) * state, state, out, s.t * state])?;
    w_after.extend(w_state);
    Ok(Runs {
        window: (w_out, w_after),
        per_token: (p_out, p_states),
    })
}

/// The CPU twin's output and the state after every token.
fn reference(c: &Case) -> (Vec<f32>, Vec<f32>) {
    let s = c.s.d;
    let t = tensor_as;
    let dtype = c.inp.dtype();
    let [q, k, v, g, beta, state, z, weight] = &c.arrays;
    let (qk, vs, gs) = (
        &[s.b, s.t, s.hk, s.dk][..],
        &[s.b, s.t, s.hv, s.dv][..],
        &[s.b, s.t, s.hv][..],
    );
    let state = t(state, &[s.b, s.hv, s.dv, s.dk], c.st.dtype());
    let mut z_full = z.clone();
    z_full.resize(s.b * c.z_strides.0, f32::NAN);
    let z = t(&z_full, &[s.b, s.t + 1, c.z_strides.1], dtype)
        .narrow(1, 0, s.t)
        .unwrap()
        .narrow(2, 0, s.hv * s.dv)
        .unwrap();
    let after = Tensor::zeros(
        (s.t - 1, s.b, s.hv, s.dv, s.dk),
        c.st.dtype(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let out = gated_delta_update_norm_window(
        &t(q, qk, dtype),
        &t(k, qk, dtype),
        &t(v, vs, dtype),
        &t(g, gs, DType::F32),
        &t(beta, gs, DType::F32),
        &state,
        &z,
        &t(weight, &[s.dv], dtype),
        1e-6,
        c.gate,
        &after,
    )
    .unwrap();
    let mut states = values(&after);
    states.extend(values(&state));
    (values(&out), states)
}

fn check(c: &Case) -> Vec<String> {
    let runs = match run_harness(c) {
        Ok(r) => r,
        Err(e) => return vec![e],
    };
    let mut bad = vec![];
    for (name, got, want) in [
        ("out", &runs.window.0, &runs.per_token.0),
        ("states", &runs.window.1, &runs.per_token.1),
    ] {
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            bad.push(format!(
                "{name}[{i}] = {} vs {} of the one-token launches",
                got[i], want[i]
            ));
        }
    }
    let (out, states) = reference(c);
    match c.st {
        St::F32 => {
            let scale = max_abs(&out);
            let (worst, at) = worst_excess(&runs.window.0, &out, c.inp, 2.0, REL_TOL, scale);
            if worst > 1.0 {
                bad.push(format!(
                    "out[{at}] = {} vs twin {} ({worst:.3e}x the allowed)",
                    runs.window.0[at], out[at]
                ));
            }
            bad.extend(f32_state_gate(&runs.window.1, &states, REL_TOL));
        }
        // Rounded to bf16 after every token on both sides from f32 values summed in another
        // order: a tie that rounds the other way carries into the later tokens.
        St::Bf16 => {
            for (name, got, want, tol) in [
                ("out", &runs.window.0, &out, 2.0 * BF16_STATE_TOL),
                ("states", &runs.window.1, &states, BF16_STATE_TOL),
            ] {
                let (e, at) = rel_err(got, want);
                if e.is_nan() || e > tol {
                    bad.push(format!(
                        "{name}[{at}] = {} vs twin {}: {e:.3e} of max > {tol:e}",
                        got[at], want[at]
                    ));
                }
            }
        }
    }
    bad
}

#[test]
fn shipped_window_kernels_are_one_token_launches_bit_for_bit() {
    HARNESS.path();
    let (mut failures, mut runs) = (vec![], 0);
    // Windows of up to 8 tokens (a verify pass's): the 37-token prefill case is no window and
    // takes minutes on the emulation.
    let windows = cases().into_iter().filter(|c| c.d.t <= 8);
    for (si, s) in windows.enumerate() {
        for (ii, &(inp, st)) in INSTANTIATIONS.iter().enumerate() {
            let gate = [Gate::Silu, Gate::Sigmoid][(si + ii) % 2];
            let c = make_case(s, inp, st, gate, 0x3E7D_0000 + (si * 8 + ii) as u64);
            runs += 1;
            for bad in check(&c) {
                failures.push(format!(
                    "gated_delta_norm_window_{}_{} {s:?} {gate:?}: {bad}",
                    inp.name(),
                    st.name()
                ));
            }
        }
    }
    common::assert_no_failures(&failures, runs, "cases fail");
}

/// What the C++ build cannot see: the buffer indices of the window entries and their
/// instantiation names.
#[test]
fn window_kernel_abi_in_source() {
    let flat = emu::strip_block_comments(&emu::shipped_source_including(
        "kernels/gated_delta_norm.metal",
        "gated_delta_norm.h",
    ));
    emu::assert_buffers(
        &flat,
        "#define GDN_NORM_WINDOW_KERNEL(",
        &[
            "q", "k", "v", "g", "beta", "state", "z", "weight", "out", "after", "p",
        ],
    );
    for (inp, st) in INSTANTIATIONS {
        let line = format!(
            "GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_{}_{}, {}, {})",
            inp.name(),
            st.name(),
            inp.msl(),
            st.msl()
        );
        assert!(flat.contains(&line), "missing `{line}`");
        if inp == In::Bf16 || st == St::Bf16 {
            emu::assert_bfloat_guarded(&flat, &line);
        }
    }
}
