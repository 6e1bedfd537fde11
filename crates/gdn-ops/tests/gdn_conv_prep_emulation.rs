//! The shipped Metal kernel `kernels/gdn_conv_prep.metal`, compiled as C++ with clang-19 and
//! the Metal emulation header (`kernels/emu/`), run on the CPU for all three
//! `gdn_conv_prep_{t}` kernels and compared with the CPU twin
//! [`gdn_ops::ops::gdn_conv_prep::gdn_conv_prep`], on the real Qwen3-Next-80B-A3B and Qwen3.5
//! shapes and on edge sizes (one key head, Dk = 256, K = 2 and 8, head slots not a multiple
//! of the threadgroup's four, qkv, b and a as strided views with NaN between their rows),
//! for decode steps (S = 1, the state advanced in place) and prefill chunks (S = 2, K − 2,
//! K − 1, K, 37, the old state read-only, the new one in its own buffer): the op's cases
//! (tests/common/gdn_conv_prep.rs) up to the emulator's work bound.
//!
//! Gates, per case: the conv state bit for bit (it is only moved); q, k and v within one ulp
//! of InT of the twin's (both round once from f32 values that differ by summation order), or
//! 1e-5 of the output's max |value|; g and beta within 1e-5 of their max |value|. And the
//! kernel's own consistency: a chunk gives bit for bit what its tokens give one decode step
//! at a time.

mod common;
mod emu;

use candle_core::DType;
use common::gdn_conv_prep::{
    cases, dims, inputs, seed, Case as OpCase, Inputs, EMULATION_MAX_WORK,
};
use common::{tensor_as, values, worst_excess, Input, Ty as In, TYPES};
use gdn_ops::ops::gdn_conv_prep::{gdn_conv_prep, qk_scales, ConvPrepDims, NORM_EPS};
use std::time::Instant;

static HARNESS: emu::Harness = emu::Harness::metal("gdn_conv_prep_harness");

struct Case {
    ty: In,
    dims: ConvPrepDims,
    batch: usize,
    tokens: usize,
    /// Token strides of the views qkv, b and a (≥ their row lengths); each batch row spans
    /// `tokens + 1` token strides when the views are padded, else `tokens`.
    strides: [usize; 3],
    /// Token rows per batch row in the views' storage.
    rows_per_batch: usize,
    /// The op's inputs, qkv, b and a as the views' storage: rows at their strides, NaN
    /// between them.
    x: Inputs,
}

/// `[batch, rows_per_batch]` rows of `stride` values, the first `tokens` rows of each batch
/// row holding the next `len` values of `rows`, NaN everywhere else (the storage of a padded
/// view).
fn strided(
    rows: &[f32],
    batch: usize,
    rows_per_batch: usize,
    tokens: usize,
    stride: usize,
    len: usize,
) -> Vec<f32> {
    let mut v = vec![f32::NAN; batch * rows_per_batch * stride];
    for (r, row) in rows.chunks_exact(len).enumerate() {
        let at = ((r / tokens) * rows_per_batch + r % tokens) * stride;
        v[at..at + len].copy_from_slice(row);
    }
    v
}

/// Case `i` of the op's cases at `ty`, the views' storage padded as the case says.
fn make_case(i: usize, c: &OpCase, ty: In) -> Case {
    make_case_from(c, ty, seed(i, ty))
}

fn make_case_from(c: &OpCase, ty: In, seed: u64) -> Case {
    let x = inputs(c, ty, seed);
    let (pad, batch, tokens) = (c.pad, c.batch, c.tokens);
    let (ch, hv) = (c.dims.channels(), c.dims.value_heads);
    let strides = [ch + 3 * pad, hv + pad, hv + 2 * pad];
    let rows_per_batch = tokens + usize::from(pad > 0);
    let view = |rows: &[f32], stride: usize, len: usize| {
        strided(rows, batch, rows_per_batch, tokens, stride, len)
    };
    Case {
        ty,
        dims: c.dims,
        batch,
        tokens,
        strides,
        rows_per_batch,
        x: Inputs {
            qkv: view(&x.qkv, strides[0], ch),
            b: view(&x.b, strides[1], hv),
            a: view(&x.a, strides[2], hv),
            ..x
        },
    }
}

/// q, k, v, g, beta and the advanced conv state, flattened.
type Outputs = [Vec<f32>; 6];

fn run_harness(c: &Case) -> Result<Outputs, String> {
    let d = c.dims;
    let mut input = Input::new(b"GCPEMU02");
    let batch_stride = |token_stride: usize| c.rows_per_batch * token_stride;
    let header = [
        c.ty as usize,
        c.batch,
        c.tokens,
        d.key_heads,
        d.key_dim,
        d.value_heads,
        d.value_dim,
        d.kernel_size,
        batch_stride(c.strides[0]),
        c.strides[0],
        batch_stride(c.strides[1]),
        c.strides[1],
        batch_stride(c.strides[2]),
        c.strides[2],
    ];
    for h in header {
        input.u32(h as u32);
    }
    let (q_scale, k_scale) = qk_scales(d.key_dim);
    for f in [q_scale, k_scale, NORM_EPS] {
        input.f32(f);
    }
    // The views' storage up to the last value they hold (the harness reads exactly that).
    let span = |x: &[f32], stride: usize, len: usize| -> Vec<f32> {
        let end = ((c.batch - 1) * c.rows_per_batch + c.tokens - 1) * stride + len;
        x[..end].to_vec()
    };
    let (hv, ch) = (d.value_heads, d.channels());
    for a in [
        &span(&c.x.qkv, c.strides[0], ch),
        &span(&c.x.b, c.strides[1], hv),
        &span(&c.x.a, c.strides[2], hv),
        &c.x.state,
        &c.x.taps,
        &c.x.dt_bias,
        &c.x.neg_a_exp,
    ] {
        input.f32s(a);
    }
    let floats = HARNESS.run(&input.0)?;
    let rows = c.batch * c.tokens;
    let qk = rows * d.key_heads * d.key_dim;
    let gates = rows * d.value_heads;
    let lens = [qk, qk, gates * d.value_dim, gates, gates, c.x.state.len()];
    if floats.len() != lens.iter().sum::<usize>() {
        return Err(format!(
            "harness wrote {} floats, expected {}",
            floats.len(),
            lens.iter().sum::<usize>()
        ));
    }
    let mut at = 0;
    Ok(lens.map(|n| {
        at += n;
        floats[at - n..at].to_vec()
    }))
}

/// The CPU twin on the same inputs, qkv, b and a passed as the same strided views.
fn reference(c: &Case) -> Outputs {
    let d = c.dims;
    let dtype = c.ty.dtype();
    let view = |x: &[f32], stride: usize, len: usize| {
        tensor_as(x, &[c.batch, c.rows_per_batch, stride], dtype)
            .narrow(1, 0, c.tokens)
            .unwrap()
            .narrow(2, 0, len)
            .unwrap()
    };
    let t = tensor_as;
    let state = t(
        &c.x.state,
        &[c.batch, d.kernel_size - 1, d.channels()],
        dtype,
    );
    let out = gdn_conv_prep(
        &view(&c.x.qkv, c.strides[0], d.channels()),
        &view(&c.x.b, c.strides[1], d.value_heads),
        &view(&c.x.a, c.strides[2], d.value_heads),
        &state,
        &t(&c.x.taps, &[d.kernel_size, d.channels()], dtype),
        &t(&c.x.dt_bias, &[d.value_heads], DType::F32),
        &t(&c.x.neg_a_exp, &[d.value_heads], DType::F32),
        d,
    )
    .unwrap();
    let f = values;
    [
        f(&out.q),
        f(&out.k),
        f(&out.v),
        f(&out.g),
        f(&out.beta),
        // The state after the chunk: `state` itself for one token (in place), else a new
        // tensor.
        f(&out.conv_state),
    ]
}

const REL_TOL: f32 = 1e-5;
const NAMES: [&str; 6] = ["q", "k", "v", "g", "beta", "conv_state"];

/// Checks one case; returns a description of every gate it fails.
fn check(c: &Case) -> Vec<String> {
    let got = match run_harness(c) {
        Ok(o) => o,
        Err(e) => return vec![e],
    };
    let want = reference(c);
    let mut bad = vec![];
    for (i, name) in NAMES.iter().enumerate() {
        let (g, w) = (&got[i], &want[i]);
        if i == 5 {
            let differ = g
                .iter()
                .zip(w)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if differ > 0 {
                bad.push(format!(
                    "{differ} conv_state values differ from the twin's (they are only moved)"
                ));
            }
            continue;
        }
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        // Activations are rounded to InT; g and beta stay f32.
        let ty = if i < 3 { c.ty } else { In::F32 };
        let (worst, at) = worst_excess(g, w, ty, 1.0, REL_TOL, scale);
        if worst > 1.0 {
            bad.push(format!(
                "{name}[{at}] = {} vs twin {} ({worst:.3e}x the allowed 1 {} ulp / {REL_TOL:e} of max {scale:.3e})",
                g[at],
                w[at],
                ty.name()
            ));
        }
    }
    bad
}

/// The op's cases the emulator runs in time ([`EMULATION_MAX_WORK`]), at every type.
#[test]
fn shipped_gdn_conv_prep_kernels_match_the_cpu_twin() {
    let started = Instant::now();
    HARNESS.path();
    let mut failures = vec![];
    let mut runs = 0;
    for (i, op) in cases().iter().enumerate() {
        if op.work() > EMULATION_MAX_WORK {
            continue;
        }
        for ty in TYPES {
            let c = make_case(i, op, ty);
            runs += 1;
            for bad in check(&c) {
                let (d, batch, tokens, pad) = (op.dims, op.batch, op.tokens, op.pad);
                failures.push(format!(
                    "gdn_conv_prep_{} {d:?} B{batch} S{tokens} pad {pad} state {}: {bad}",
                    ty.name(),
                    op.with_state
                ));
            }
        }
    }
    eprintln!("{runs} cases in {:.1}s", started.elapsed().as_secs_f32());
    common::assert_no_failures(&failures, runs, "cases fail");
}

/// Token `t` of every batch row of a chunk as a one-token case (the conv state given).
fn one_token(c: &Case, t: usize, state: Vec<f32>) -> Case {
    let rows = |x: &[f32], stride: usize| -> Vec<f32> {
        (0..c.batch)
            .flat_map(|b| {
                let at = (b * c.rows_per_batch + t) * stride;
                x[at..at + stride].to_vec()
            })
            .collect()
    };
    Case {
        ty: c.ty,
        dims: c.dims,
        batch: c.batch,
        tokens: 1,
        strides: c.strides,
        rows_per_batch: 1,
        x: Inputs {
            qkv: rows(&c.x.qkv, c.strides[0]),
            b: rows(&c.x.b, c.strides[1]),
            a: rows(&c.x.a, c.strides[2]),
            state,
            ..c.x.clone()
        },
    }
}

/// A prefill chunk and the same tokens decoded one at a time through the shipped kernel give
/// the same q, k, v, g, beta and final conv state, bit for bit.
#[test]
fn shipped_kernel_prefill_matches_its_decode_steps_bit_for_bit() {
    let cases = [
        (dims(2, 32, 4, 32, 4), 2, 6, 3),
        (dims(2, 32, 4, 32, 4), 1, 2, 0),
        (dims(1, 64, 2, 96, 8), 2, 5, 1),
    ];
    for (si, &(d, batch, tokens, pad)) in cases.iter().enumerate() {
        for ty in TYPES {
            let op = OpCase {
                dims: d,
                batch,
                tokens,
                with_state: true,
                pad,
            };
            let c = make_case_from(&op, ty, 0xDEC0_0000 + si as u64);
            let what = format!("gdn_conv_prep_{} {d:?} B{batch} S{tokens}", ty.name());
            let chunk = run_harness(&c).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut state = c.x.state.clone();
            let mut steps: Vec<Outputs> = vec![];
            for t in 0..tokens {
                let step = run_harness(&one_token(&c, t, state)).unwrap();
                state = step[5].clone();
                steps.push(step);
            }
            // The chunk's outputs are [B, S, ..]; the steps' [B, 1, ..]: interleave them.
            for (i, name) in NAMES.iter().enumerate().take(5) {
                let per_row = chunk[i].len() / (batch * tokens);
                let stepped: Vec<u32> = (0..batch)
                    .flat_map(|b| {
                        steps.iter().flat_map(move |s| {
                            s[i][b * per_row..(b + 1) * per_row]
                                .iter()
                                .map(|x| x.to_bits())
                        })
                    })
                    .collect();
                let bits: Vec<u32> = chunk[i].iter().map(|x| x.to_bits()).collect();
                assert!(
                    bits == stepped,
                    "{what}: {name} differs from the decode steps'"
                );
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&chunk[5]), bits(&state), "{what}: conv state");
        }
    }
}

/// What the C++ build cannot see: the buffer indices (attributes, ignored by clang), the
/// parameter struct the Rust host mirrors, and the instantiation names the host looks up.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "gdn_conv_prep.h",
        "ConvPrepParams",
        &[
            "batch",
            "tokens",
            "key_heads",
            "key_dim",
            "value_heads",
            "value_dim",
            "kernel_size",
            "qkv_batch_stride",
            "qkv_token_stride",
            "b_batch_stride",
            "b_token_stride",
            "a_batch_stride",
            "a_token_stride",
            "float q_scale",
            "float k_scale",
            "float norm_eps",
        ],
    );
    assert_eq!(
        std::mem::size_of::<gdn_ops::ops::gdn_conv_prep::ConvPrepParams>(),
        16 * 4
    );
    // Block comments inside the macro are documentation, not ABI.
    let flat = emu::strip_block_comments(&emu::shipped_source_including(
        "kernels/gdn_conv_prep.metal",
        "gdn_conv_prep.h",
    ));
    let buffers = [
        "qkv",
        "b_in",
        "a_in",
        "conv_state",
        "next_state",
        "taps",
        "dt_bias",
        "neg_a_exp",
        "q",
        "k",
        "v",
        "g",
        "beta",
        "p",
    ];
    emu::assert_buffers(&flat, "#define GDN_CONV_PREP(", &buffers);
    for ty in TYPES {
        let line = format!("GDN_CONV_PREP(gdn_conv_prep_{}, {})", ty.name(), ty.msl());
        assert!(flat.contains(&line), "missing `{line}`");
    }
    emu::assert_bfloat_guarded(&flat, "GDN_CONV_PREP(gdn_conv_prep_bf16, bfloat)");
}
