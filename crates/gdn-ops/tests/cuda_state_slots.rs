//! The CUDA slot kernels (`gdn_conv_prep_slots_*` in kernels/gdn_conv_prep.cu,
//! `gated_delta_norm_slots{,_cluster}_*` in kernels/gated_delta_norm.cu, `attn_prep_slots_*`
//! in kernels/attn_prep.cu, `attn_decode_slots_*` and `attn_decode_combine_slots_*` in
//! kernels/attn_decode.cu) against the
//! per-sequence CUDA kernels row by row, bit for bit (tests/common/state_slots.rs: what a
//! batched decode step needs for each sequence to get its own tokens), and against the CPU
//! twins within the per-sequence kernels' tolerance (tests/common/gpu.rs). Built only with the
//! `cuda` feature and run on the GPU machine; without a CUDA device every test fails.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device};
use common::state_slots::{
    assert_conv_slots_exact, assert_decode_slots_exact, assert_prep_slots_exact,
    assert_recurrence_slots_exact, conv_cases, decode_cases, prep_cases, recurrence_cases,
};
use common::{close, gpu, rel_max, tolerance, values, TYPES};
use gdn_ops::ops::gated_delta_norm::Gate;

#[test]
fn recurrence_slots_match_the_per_sequence_kernel_and_the_twin() {
    let dev = gpu();
    for (i, c) in recurrence_cases().into_iter().enumerate() {
        for (j, (dtype, st)) in [
            (DType::F32, DType::F32),
            (DType::F32, DType::BF16),
            (DType::BF16, DType::F32),
            (DType::F16, DType::BF16),
        ]
        .into_iter()
        .enumerate()
        {
            let gate = [Gate::Silu, Gate::Sigmoid][(i + j) % 2];
            let seed = 300 + 10 * i as u64;
            let (got, got_states) = assert_recurrence_slots_exact(&dev, c, dtype, st, gate, seed);
            let (want, want_states) =
                assert_recurrence_slots_exact(&Device::Cpu, c, dtype, st, gate, seed);
            let tol = tolerance(dtype).max(tolerance(st));
            for (g, w) in got
                .iter()
                .zip(&want)
                .chain(got_states.iter().zip(&want_states))
            {
                let e = rel_max(g, w);
                assert!(
                    e <= 2.0 * tol,
                    "{c:?} {dtype:?}/{st:?}: {e:e} against the twin"
                );
            }
        }
    }
}

#[test]
fn conv_slots_match_the_per_sequence_kernel_and_the_twin() {
    let dev = gpu();
    for (i, c) in conv_cases().into_iter().enumerate() {
        for ty in TYPES {
            let seed = 400 + 10 * i as u64 + ty as u64;
            let (got, got_states) = assert_conv_slots_exact(&dev, c, ty, seed);
            let (want, want_states) = assert_conv_slots_exact(&Device::Cpu, c, ty, seed);
            let tol = tolerance(ty.dtype());
            for (g, w) in got
                .iter()
                .zip(&want)
                .chain(got_states.iter().zip(&want_states))
            {
                let e = rel_max(g, w);
                assert!(e <= 2.0 * tol, "{c:?} {ty:?}: {e:e} against the twin");
            }
        }
    }
}

/// The prep's kernel against its twin: gate and values copied (bit for bit), q and keys
/// within the per-sequence kernel's gate (its rsqrt and sin/cos differ by a few f32 ulp):
/// 2× the activation tolerance here.
#[test]
fn attn_prep_slots_match_the_per_sequence_kernel_and_the_twin() {
    let dev = gpu();
    for (i, c) in prep_cases().into_iter().enumerate() {
        for ty in TYPES {
            let seed = 600 + 10 * i as u64 + ty as u64;
            let (got, got_kv) = assert_prep_slots_exact(&dev, c, ty, seed);
            let (want, want_kv) = assert_prep_slots_exact(&Device::Cpu, c, ty, seed);
            let tol = tolerance(ty.dtype());
            for (g, w) in got.iter().zip(&want).chain(got_kv.iter().zip(&want_kv)) {
                let e = rel_max(g, w);
                assert!(e <= 2.0 * tol, "{c:?} {ty:?}: {e:e} against the twin");
            }
        }
    }
}

/// The decode attention's slot kernels against the per-sequence launches (one pass, the
/// shipped split, the pipelined pass, head pairs: each sequence its own, ragged capacities in
/// one launch) bit for bit, and against the twin within the per-sequence kernel's gate
/// (tests/cuda_attn_decode.rs: 2 ulp of InT plus 1e-5 of max |ref|).
#[test]
fn attn_decode_slots_match_the_per_sequence_kernels_and_the_twin() {
    let dev = gpu();
    let mut failures = vec![];
    for (i, c) in decode_cases().iter().enumerate() {
        for ty in TYPES {
            let seed = 800 + 10 * i as u64 + ty as u64;
            let got = assert_decode_slots_exact(&dev, c, ty, seed);
            let want = assert_decode_slots_exact(&Device::Cpu, c, ty, seed);
            if let Some(e) = close("out", &values(&got), &values(&want), ty, 2.0, 1e-5) {
                failures.push(format!("{c:?} {ty:?}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
