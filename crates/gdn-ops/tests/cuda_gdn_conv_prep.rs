//! The CUDA kernels `kernels/gdn_conv_prep.cu` against the CPU twin, for every instantiation
//! (f32, f16, bf16), on random inputs over the op's cases (tests/common/gdn_conv_prep.rs): the
//! real Qwen3-Next-80B-A3B and Qwen3.5 shapes and edge sizes, with qkv, b and a as slices of
//! one merged projection output. Built only
//! with the `cuda` feature and run on the GPU machine; without a CUDA device every test
//! fails.
//!
//! Measure: max |got − want| / max |want| per output (NaN fails). The conv state is only
//! moved: bit for bit. f32 outputs to 2e-5 (summation order, rsqrtf); f16 and bf16 outputs,
//! rounded once on each side from nearby f32 values, to one ulp of the dtype at the largest
//! value (1e-3 and 8e-3).
//!
//! Prefill chunks (S > 1) as well: the release shape at S = 2048, and S < K − 1, K − 1, K and
//! 37, from a conv state and from zeros; the old state must be left as it was; and a chunk
//! must give bit for bit what its tokens give one decode step at a time on the GPU.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device};
use common::gdn_conv_prep::{assert_chunk_is_its_steps, cases, dims, Case, Tensors};
use common::{gpu, rel_max, tolerance, values, Ty, TYPES};
use gdn_ops::ops::gdn_conv_prep::ConvPrepOut;

/// One case of the op's cases at `ty` on the GPU and the CPU: outputs within the gates, the
/// conv state after the step or chunk bit for bit, and, for a chunk, the old state left as it
/// was.
fn check(dev: &Device, i: usize, c: &Case, ty: Ty) {
    let (d, batch, tokens, with_state) = (c.dims, c.batch, c.tokens, c.with_state);
    let dtype = ty.dtype();
    let chunk = Tensors::of_case(i, c, ty);
    let what = format!("gdn_conv_prep {d:?} B{batch} S{tokens} {dtype:?} state {with_state}");
    // A copy of the state: on the CPU the twin shifts the conv window of a decode step in
    // place.
    let cpu_state = chunk.state.copy().unwrap();
    let want = chunk.run(&Device::Cpu, 0, tokens, &cpu_state);
    let gpu_state = chunk.state.to_device(dev).unwrap();
    let got = chunk.run(dev, 0, tokens, &gpu_state);
    if tokens == 1 {
        assert_eq!(values(&gpu_state), values(&cpu_state), "{what}: conv state");
    } else {
        assert_eq!(
            values(&gpu_state),
            values(&chunk.state),
            "{what}: the old state must be left as it was"
        );
        assert_eq!(
            values(&got.conv_state),
            values(&want.conv_state),
            "{what}: conv state after the chunk"
        );
    }
    for (name, g, w, tol) in [
        ("q", &got.q, &want.q, tolerance(dtype)),
        ("k", &got.k, &want.k, tolerance(dtype)),
        ("v", &got.v, &want.v, tolerance(dtype)),
        ("g", &got.g, &want.g, tolerance(DType::F32)),
        ("beta", &got.beta, &want.beta, tolerance(DType::F32)),
    ] {
        assert_eq!(g.dims(), w.dims(), "{what}: {name} shape");
        let e = rel_max(g, w);
        eprintln!("{what}: {name} rel err {e:.2e} (tol {tol:.0e})");
        assert!(e <= tol, "{what}: {name} rel err {e:e} > {tol:e}");
    }
}

/// The op's decode steps (S = 1) or prefill chunks, at every type.
fn check_cases(chunks: bool) {
    let dev = gpu();
    for (i, c) in cases().iter().enumerate() {
        if (c.tokens > 1) == chunks {
            for ty in TYPES {
                check(&dev, i, c, ty);
            }
        }
    }
}

#[test]
fn gdn_conv_prep_matches_the_cpu_twin() {
    check_cases(false);
}

#[test]
fn gdn_conv_prep_prefill_chunks_match_the_cpu_twin() {
    check_cases(true);
}

#[test]
fn gdn_conv_prep_prefill_gives_its_decode_steps_bit_for_bit_on_the_gpu() {
    let dev = gpu();
    for (d, tokens) in [(dims(16, 128, 32, 128, 4), 9), (dims(1, 256, 3, 96, 8), 5)] {
        for ty in [Ty::F32, Ty::Bf16] {
            let chunk = Tensors::random(d, 2, tokens, ty, 0xDEC0DE);
            let what = format!("gdn_conv_prep {d:?} S{tokens} {ty:?}");
            let whole = chunk.run(&dev, 0, tokens, &chunk.state.to_device(&dev).unwrap());
            let state = chunk.state.to_device(&dev).unwrap();
            let steps: Vec<ConvPrepOut> =
                (0..tokens).map(|t| chunk.run(&dev, t, 1, &state)).collect();
            assert_chunk_is_its_steps(&what, &whole, &steps, &state);
        }
    }
}

#[test]
fn gdn_conv_prep_empty_chunk_launches_nothing_on_the_gpu() {
    let dev = gpu();
    let chunk = Tensors::random(dims(16, 128, 32, 128, 4), 2, 3, Ty::Bf16, 7);
    let state = chunk.state.to_device(&dev).unwrap();
    let launches = gdn_ops::launches::count();
    let out = chunk.run(&dev, 1, 0, &state);
    assert_eq!(gdn_ops::launches::count(), launches);
    assert_eq!(out.q.dims(), [2, 0, 16, 128]);
    assert_eq!(out.g.dims(), [2, 0, 32]);
    assert_eq!(values(&out.conv_state), values(&chunk.state));
}
