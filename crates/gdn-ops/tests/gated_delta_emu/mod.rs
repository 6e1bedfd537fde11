//! What the emulation tests of the gated-delta recurrence kernels share
//! (`metal_emulation.rs` for the Metal step kernel, `gated_delta_chunk_emulation.rs` for the
//! Metal chunk kernels, `gated_delta_chunk_cuda_emulation.rs` for the CUDA ones): the cases,
//! the harness protocol, the CPU reference and the gates, and the driver that runs the cases on
//! all cores. Each test names its harness and its case list; the inputs come from
//! `common::gated_delta`.
#![allow(dead_code)] // each test uses its part: `numbered` seeds are for the chunk tests

use crate::common::gated_delta::{
    bf16_state_sibling_gates, f32_state_gate, gdn_inputs, padding_mask, GdnDims, INSTANTIATIONS,
};
use crate::common::{
    failures_on_all_cores, max_abs, tensor_as, values, worst_excess, Rng, St, Ty as In,
};
use crate::emu;
use candle_core::DType;
use gdn_ops::GdnForm;
use half::bf16;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A harness, the magic its input starts with, the kernel family's name in reports, and the
/// CPU form it is compared with.
pub struct Kernel {
    pub harness: &'static emu::Harness,
    pub magic: &'static [u8; 8],
    /// `gated_delta_step` or `gated_delta_chunk`: the report names `<name>_<in>_<st>`.
    pub name: &'static str,
    /// The reference form: `None` for the one the library picks by length
    /// ([`gdn_ops::gated_delta_update_masked`]).
    pub reference: Option<GdnForm>,
}

/// One emulated run: an instantiation, a shape, whether padded, and the inputs' seed.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub inp: In,
    pub st: St,
    pub shape: Shape,
    pub masked: bool,
    pub seed: u64,
}

/// `(instantiation, shape, masked)` jobs seeded 1000, 1001, ... in order.
pub fn numbered(jobs: Vec<(In, St, Shape, bool)>) -> Vec<Job> {
    jobs.into_iter()
        .enumerate()
        .map(|(i, (inp, st, shape, masked))| Job {
            inp,
            st,
            shape,
            masked,
            seed: 1000 + i as u64,
        })
        .collect()
}

pub struct Case {
    d: GdnDims,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
    mask: Option<Vec<f32>>,
}

pub fn make_case(job: &Job) -> Case {
    let Shape {
        b,
        t,
        hk,
        ratio,
        dk,
        dv,
    } = job.shape;
    let d = GdnDims::new(b, t, hk, hk * ratio, dk, dv);
    let mut rng = Rng::new(job.seed);
    let x = gdn_inputs(&mut rng, job.inp, job.st, d);
    let mask = job.masked.then(|| padding_mask(&mut rng, b, t));
    Case {
        d,
        q: x.q,
        k: x.k,
        v: x.v,
        g: x.g,
        beta: x.beta,
        state: x.state,
        mask,
    }
}

pub struct Out {
    y: Vec<f32>,
    state: Vec<f32>,
}

fn run_harness(kernel: &Kernel, c: &Case, inp: In, st: St) -> Result<Out, String> {
    let mut bytes = kernel.magic.to_vec();
    let (b, t, hk, hv, dk, dv) = c.d.tuple();
    let header = [
        b,
        t,
        hk,
        hv,
        dk,
        dv,
        c.mask.is_some() as usize,
        inp.code() as usize,
        st.code() as usize,
    ];
    for h in header {
        bytes.extend_from_slice(&(h as u32).to_le_bytes());
    }
    let arrays = [&c.q, &c.k, &c.v, &c.g, &c.beta, &c.state];
    for x in arrays.into_iter().chain(c.mask.as_ref()) {
        x.iter()
            .for_each(|f| bytes.extend_from_slice(&f.to_le_bytes()));
    }
    let floats = kernel.harness.run(&bytes)?;
    let [y, state] = emu::split_output(floats, [b * t * hv * dv, c.state.len()])?;
    Ok(Out { y, state })
}

fn reference(form: Option<GdnForm>, c: &Case, inp: In, st: St) -> Out {
    let (b, steps, hk, hv, dk, dv) = c.d.tuple();
    let t = tensor_as;
    let (qk, v, gate) = (
        &[b, steps, hk, dk][..],
        &[b, steps, hv, dv][..],
        &[b, steps, hv][..],
    );
    let state = t(&c.state, &[b, hv, dv, dk], st.dtype());
    let mask = c.mask.as_ref().map(|m| t(m, &[b, steps], DType::F32));
    let (q, k, v) = (
        t(&c.q, qk, inp.dtype()),
        t(&c.k, qk, inp.dtype()),
        t(&c.v, v, inp.dtype()),
    );
    let (g, beta) = (t(&c.g, gate, DType::F32), t(&c.beta, gate, DType::F32));
    let y = match form {
        // A chunk kernel is compared with the token-by-token form (on the CPU the length
        // alone would pick the chunked one).
        Some(form) => {
            gdn_ops::gated_delta_update_in(form, &q, &k, &v, &g, &beta, &state, mask.as_ref())
        }
        None => gdn_ops::gated_delta_update_masked(&q, &k, &v, &g, &beta, &state, mask.as_ref()),
    }
    .unwrap();
    assert_eq!(
        y.dtype(),
        inp.dtype(),
        "the reference returns y in q's dtype"
    );
    let f = values;
    Out {
        y: f(&y),
        state: f(&state),
    }
}

const REL_TOL: f32 = 1e-5;

/// Checks one case; returns a description of every gate it fails.
fn check(kernel: &Kernel, c: &Case, inp: In, st: St) -> Vec<String> {
    let mut bad = vec![];
    let got = match run_harness(kernel, c, inp, st) {
        Ok(o) => o,
        Err(e) => return vec![e],
    };
    let want = reference(kernel.reference, c, inp, st);

    // y: the reference's y is already rounded to InT.
    let y_scale = max_abs(&want.y);
    let (worst, worst_at) = worst_excess(&got.y, &want.y, inp, 1.0, REL_TOL, y_scale);
    if worst > 1.0 {
        bad.push(format!(
            "y[{worst_at}] = {} vs reference {} ({worst:.3e}x the allowed 1 {} ulp / {REL_TOL:e} of max|y| {y_scale:.3e})",
            got.y[worst_at],
            want.y[worst_at],
            inp.name()
        ));
    }
    if let Some(m) = &c.mask {
        let per_bt = c.d.hv * c.d.dv;
        let nonzero = (0..got.y.len())
            .filter(|&i| m[i / per_bt] == 0.0 && got.y[i] != 0.0)
            .count();
        if nonzero > 0 {
            bad.push(format!("{nonzero} y values at padded tokens are not 0"));
        }
    }

    match st {
        St::F32 => bad.extend(f32_state_gate(&got.state, &want.state, REL_TOL)),
        St::Bf16 => {
            // The kernel's own f32 result before the rounding, and the reference's.
            let got32 = match run_harness(kernel, c, inp, St::F32) {
                Ok(o) => o.state,
                Err(e) => return vec![format!("f32-state sibling: {e}")],
            };
            let want32 = reference(kernel.reference, c, inp, St::F32).state;
            bad.extend(bf16_state_sibling_gates(
                &got.state, &got32, &want32, REL_TOL,
            ));
            let round = |x: f32| bf16::from_f32(x).to_f32();
            let (mut straddles, mut mismatches, mut first) = (0, 0, None);
            for i in 0..got.state.len() {
                if got.state[i].to_bits() == want.state[i].to_bits() {
                    continue;
                }
                // Both sides rounded their own f32 value once; they differ only if those
                // values (equal within the f32 gate, which near 0 can be more than one bf16
                // ulp) fall on either side of a rounding boundary.
                let straddle = round(want32[i]).to_bits() == want.state[i].to_bits()
                    && round(got32[i]).to_bits() == got.state[i].to_bits()
                    && (got32[i] - want32[i]).abs() <= REL_TOL * max_abs(&want32);
                if straddle {
                    straddles += 1;
                } else {
                    mismatches += 1;
                    first.get_or_insert(i);
                }
            }
            if let Some(i) = first {
                bad.push(format!(
                    "{mismatches} bf16 state values differ from the reference's bf16 state, e.g. [{i}] = {} vs {}",
                    got.state[i], want.state[i]
                ));
            }
            // A rounding tie broken differently by f32 summation order is rare; many of them
            // would mean something else is wrong.
            if straddles * 1000 > got.state.len() {
                bad.push(format!(
                    "{straddles} of {} bf16 state values sit on a rounding boundary",
                    got.state.len()
                ));
            }
            STRADDLES.fetch_add(straddles, Ordering::Relaxed);
        }
    }
    bad
}

static STRADDLES: AtomicUsize = AtomicUsize::new(0);

/// One case's shape: batch, tokens, key heads, value heads per key head, key and value dims.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub ratio: usize,
    pub dk: usize,
    pub dv: usize,
}

/// (B, T, Hk, Hv/Hk, Dk, Dv).
pub const fn shape(b: usize, t: usize, hk: usize, ratio: usize, dk: usize, dv: usize) -> Shape {
    Shape {
        b,
        t,
        hk,
        ratio,
        dk,
        dv,
    }
}

/// Runs every job through `kernel` on all cores and fails with a per-instantiation report of
/// the cases that miss a gate.
pub fn run_all(kernel: &Kernel, jobs: Vec<Job>) {
    let started = Instant::now();
    let failures = failures_on_all_cores(&jobs, |job| {
        let bad = check(kernel, &make_case(job), job.inp, job.st);
        (!bad.is_empty())
            .then(|| format!("[{:?} mask={}] {}", job.shape, job.masked, bad.join("; ")))
    });
    eprintln!(
        "{} cases in {:.1}s; {} bf16 state values on a rounding boundary (f32 summation order)",
        jobs.len(),
        started.elapsed().as_secs_f32(),
        STRADDLES.load(Ordering::Relaxed)
    );
    let mut report = vec![];
    for (inp, st) in INSTANTIATIONS {
        let mine: Vec<_> = failures
            .iter()
            .filter(|(i, _)| (jobs[*i].inp, jobs[*i].st) == (inp, st))
            .collect();
        if let Some((_, first)) = mine.first() {
            let total = jobs.iter().filter(|j| (j.inp, j.st) == (inp, st)).count();
            report.push(format!(
                "{}_{}_{}: {} of {total} cases fail, first {first}",
                kernel.name,
                inp.name(),
                st.name(),
                mine.len()
            ));
        }
    }
    let what = "emulated kernel runs disagree with the reference";
    crate::common::assert_none_failed(failures.len(), jobs.len(), what, &report);
}

/// The chunk kernels' parameter struct, which the Metal and the CUDA hosts both mirror
/// `#[repr(C)]`.
pub fn assert_chunk_params() {
    emu::assert_params(
        "gated_delta_chunk.h",
        "GdnChunkParams",
        &[
            "batch",
            "steps",
            "chunks",
            "key_heads",
            "value_heads",
            "key_dim",
            "value_dim",
            "has_mask",
        ],
    );
}

/// Every instantiation of the three chunk passes in a flattened source of kind `kind`
/// (`KERNEL` in the `.metal` file, `ENTRY` in the `.cu` file): the state pass for each
/// InT/StT, prep and out for each InT, with `ty` naming a type (`f32`, `f16`, `bf16`) in the
/// source's language.
pub fn assert_chunk_instantiations(flat: &str, kind: &str, ty: fn(&str) -> &'static str) {
    for (inp, st) in INSTANTIATIONS {
        let line = format!(
            "GDN_CHUNK_STATE_{kind}(gated_delta_chunk_state_{}_{}, {}, {})",
            inp.name(),
            st.name(),
            ty(inp.name()),
            ty(st.name())
        );
        assert!(flat.contains(&line), "missing `{line}`");
    }
    for inp in ["f32", "f16", "bf16"] {
        for (pass, entry) in [("prep", "PREP"), ("out", "OUT")] {
            let line = format!(
                "GDN_CHUNK_{entry}_{kind}(gated_delta_chunk_{pass}_{inp}, {})",
                ty(inp)
            );
            assert!(flat.contains(&line), "missing `{line}`");
        }
    }
}
