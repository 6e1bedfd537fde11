//! The shipped Metal kernel `kernels/gated_delta_norm.metal` (the recurrence with the gated
//! RMSNorm folded in), compiled as C++ with clang-19 and the Metal emulation header
//! (`kernels/emu/`), run on the CPU for all six `gated_delta_norm_{in}_{st}` kernels and
//! compared with the CPU twin [`gdn_ops::ops::gated_delta_norm::gated_delta_update_norm`]
//! (the recurrence's reference, then the gated norm's twin), over the op's cases
//! (tests/common/gated_delta_norm.rs: the real Qwen3-Next decode shape and edge sizes, 3 to 32
//! simdgroups), z a strided view with NaN between its tokens, the output gate silu and sigmoid
//! on alternate cases.
//!
//! Gates, per case, those of the recurrence's emulation test (tests/metal_emulation.rs) for
//! the state plus the norm's for the output:
//! - f32 state: within 1e-5 of max |state| of the reference's;
//! - bf16 state: exactly the kernel's own f32-state sibling's state (run on the same inputs,
//!   itself within 1e-5 of the reference's f32 state) rounded once to bf16, and equal to the
//!   reference's bf16 state but for rounding-boundary ties (at most 0.1% of the state);
//! - out: within two ulps of InT of the twin's, or 1e-5 of max |out|: both round y to InT
//!   first (from f32 values that differ by summation order, so one y may sit one ulp apart),
//!   then the normalised y, then the output.

mod common;
mod emu;

use candle_core::DType;
use common::gated_delta::{
    bf16_state_sibling_gates, f32_state_gate, gdn_inputs, GdnDims, INSTANTIATIONS,
};
use common::gated_delta_norm::{cases, Shape};
use common::{max_abs, tensor_as, values, worst_excess, Input, Rng, St, Ty as In};
use gdn_ops::ops::gated_delta_norm::{gated_delta_update_norm, Gate};
use std::time::Instant;

static HARNESS: emu::Harness = emu::Harness::metal("gated_delta_norm_harness");

struct Case {
    s: Shape,
    inp: In,
    gate: Gate,
    z_strides: (usize, usize),
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    /// f32 values, exact in bf16 for a bf16 state.
    state: Vec<f32>,
    z: Vec<f32>,
    weight: Vec<f32>,
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
        gate,
        z_strides,
        q: x.q,
        k: x.k,
        v: x.v,
        g: x.g,
        beta: x.beta,
        state: x.state,
        z,
        weight,
    }
}

struct Out {
    out: Vec<f32>,
    state: Vec<f32>,
}

fn run_harness(c: &Case, st: St) -> Result<Out, String> {
    let s = c.s.d;
    let mut input = Input::new(b"GDNNEMU1");
    let header = [
        s.b,
        s.t,
        s.hk,
        s.hv,
        s.dk,
        s.dv,
        c.inp as usize,
        st as usize,
        c.s.simdgroups,
        c.z_strides.0,
        c.z_strides.1,
        usize::from(c.gate == Gate::Sigmoid),
    ];
    for h in header {
        input.u32(h as u32);
    }
    input.f32(1e-6);
    for a in [&c.q, &c.k, &c.v, &c.g, &c.beta, &c.state, &c.z, &c.weight] {
        input.f32s(a);
    }
    let floats = HARNESS.run(&input.0)?;
    let [out, state] = emu::split_output(floats, [s.b * s.t * s.hv * s.dv, c.state.len()])?;
    Ok(Out { out, state })
}

fn reference(c: &Case, st: St) -> Out {
    let s = c.s.d;
    let t = tensor_as;
    let dtype = c.inp.dtype();
    let (qk, v, gate) = (
        &[s.b, s.t, s.hk, s.dk][..],
        &[s.b, s.t, s.hv, s.dv][..],
        &[s.b, s.t, s.hv][..],
    );
    let state = t(&c.state, &[s.b, s.hv, s.dv, s.dk], st.dtype());
    let mut z_full = c.z.clone();
    z_full.resize(s.b * c.z_strides.0, f32::NAN);
    let z = t(&z_full, &[s.b, s.t + 1, c.z_strides.1], dtype)
        .narrow(1, 0, s.t)
        .unwrap()
        .narrow(2, 0, s.hv * s.dv)
        .unwrap();
    let out = gated_delta_update_norm(
        &t(&c.q, qk, dtype),
        &t(&c.k, qk, dtype),
        &t(&c.v, v, dtype),
        &t(&c.g, gate, DType::F32),
        &t(&c.beta, gate, DType::F32),
        &state,
        &z,
        &t(&c.weight, &[s.dv], dtype),
        1e-6,
        c.gate,
    )
    .unwrap();
    let f = values;
    Out {
        out: f(&out),
        state: f(&state),
    }
}

const REL_TOL: f32 = 1e-5;

fn check(c: &Case, st: St) -> Vec<String> {
    let inp = c.inp;
    let got = match run_harness(c, st) {
        Ok(o) => o,
        Err(e) => return vec![e],
    };
    let want = reference(c, st);
    let mut bad = vec![];

    let scale = max_abs(&want.out);
    let (worst, at) = worst_excess(&got.out, &want.out, inp, 2.0, REL_TOL, scale);
    if worst > 1.0 {
        bad.push(format!(
            "out[{at}] = {} vs twin {} ({worst:.3e}x the allowed 2 {} ulps / {REL_TOL:e} of max {scale:.3e})",
            got.out[at],
            want.out[at],
            inp.name()
        ));
    }

    match st {
        St::F32 => bad.extend(f32_state_gate(&got.state, &want.state, REL_TOL)),
        St::Bf16 => {
            let got32 = match run_harness(c, St::F32) {
                Ok(o) => o.state,
                Err(e) => return vec![format!("f32-state sibling: {e}")],
            };
            let want32 = reference(c, St::F32).state;
            bad.extend(bf16_state_sibling_gates(
                &got.state, &got32, &want32, REL_TOL,
            ));
            let ties = got
                .state
                .iter()
                .zip(&want.state)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if ties * 1000 > got.state.len() {
                bad.push(format!(
                    "{ties} of {} bf16 state values differ from the reference's (more than 0.1%)",
                    got.state.len()
                ));
            }
        }
    }
    bad
}

#[test]
fn shipped_gated_delta_norm_kernels_match_the_cpu_twin() {
    let started = Instant::now();
    HARNESS.path();
    let mut failures = vec![];
    let mut runs = 0;
    for (si, s) in cases().into_iter().enumerate() {
        for (ii, &(inp, st)) in INSTANTIATIONS.iter().enumerate() {
            let gate = [Gate::Silu, Gate::Sigmoid][(si + ii) % 2];
            let c = make_case(s, inp, st, gate, 0xD17A_0000 + (si * 8 + ii) as u64);
            runs += 1;
            for bad in check(&c, st) {
                failures.push(format!(
                    "gated_delta_norm_{}_{} {s:?} {gate:?}: {bad}",
                    inp.name(),
                    st.name()
                ));
            }
        }
    }
    eprintln!("{runs} cases in {:.1}s", started.elapsed().as_secs_f32());
    common::assert_no_failures(&failures, runs, "cases fail");
}

/// What the C++ build cannot see: the buffer and threadgroup-memory indices, the parameter
/// struct the Rust host mirrors, and the instantiation names the host looks up.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "gated_delta_norm.h",
        "GdnNormParams",
        &[
            "batch",
            "steps",
            "key_heads",
            "value_heads",
            "key_dim",
            "value_dim",
            "z_batch_stride",
            "z_token_stride",
            "float eps",
            "sigmoid_gate",
        ],
    );
    assert_eq!(
        std::mem::size_of::<gdn_ops::ops::gated_delta_norm::GdnNormParams>(),
        10 * 4
    );
    let flat = emu::strip_block_comments(&emu::shipped_source_including(
        "kernels/gated_delta_norm.metal",
        "gated_delta_norm.h",
    ));
    let start = "#define GDN_NORM_KERNEL(";
    emu::assert_buffers(
        &flat,
        start,
        &[
            "q", "k", "v", "g", "beta", "state", "z", "weight", "out", "p",
        ],
    );
    let needle = "threadgroup float* partial [[threadgroup(0)]]";
    let kernel = &flat[flat.find(start).unwrap()..];
    let body = &kernel[..kernel.find('{').unwrap_or(kernel.len())];
    assert!(body.contains(needle), "`{needle}` missing");
    for (inp, st) in INSTANTIATIONS {
        let line = format!(
            "GDN_NORM_KERNEL(gated_delta_norm_{}_{}, {}, {})",
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
