//! The CUDA kernels `kernels/gdn_conv_prep.cu` against the CPU twin, for every instantiation
//! (f32, f16, bf16), on fresh random inputs: the real Qwen3-Next-80B-A3B and Qwen3.5 shapes
//! and edge sizes, with qkv, b and a as slices of one merged projection output. Built only
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

use candle_core::{DType, Device, Tensor};
use common::{
    assert_chunk_is_its_steps, conv_prep_dims as dims, gpu, rel_max, tolerance, values, Rng,
};
use gdn_ops::ops::gdn_conv_prep::{gdn_conv_prep, ConvPrepDims, ConvPrepOut};

#[test]
fn gdn_conv_prep_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_C0DE);
    // (Hk, Dk, Hv, Dv, K, B)
    let shapes = [
        (16, 128, 32, 128, 4, 1),
        (16, 128, 32, 128, 4, 3),
        (16, 128, 64, 128, 4, 2),
        (1, 256, 3, 96, 8, 2),
        (2, 32, 4, 64, 2, 5),
    ];
    for &(hk, dk, hv, dv, kk, batch) in &shapes {
        let d = ConvPrepDims {
            key_heads: hk,
            key_dim: dk,
            value_heads: hv,
            value_dim: dv,
            kernel_size: kk,
        };
        let (c, z) = (d.channels(), hv * dv);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let seed = rng.next();
            let mut r = Rng::xorshift(seed | 1);
            let proj = Tensor::cat(
                &[
                    r.tensor(&[batch, 1, c + z], -2.0, 2.0),
                    r.tensor(&[batch, 1, 2 * hv], -10.0, 10.0),
                ],
                2,
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
            let state = r
                .tensor(&[batch, kk - 1, c], -2.0, 2.0)
                .to_dtype(dtype)
                .unwrap();
            let taps = r.tensor(&[kk, c], -0.6, 0.6).to_dtype(dtype).unwrap();
            let dt_bias = r.tensor(&[hv], -1.0, 1.0);
            let neg_a_exp = r.tensor(&[hv], -3.0, 2.5).exp().unwrap().neg().unwrap();
            let run = |dev: &Device| {
                let up = |t: &Tensor| t.to_device(dev).unwrap();
                // A copy of the state: on the CPU `to_device` shares storage, and the twin
                // shifts the conv window in place before the GPU's run would read it.
                let (proj, st) = (up(&proj), state.to_device(dev).unwrap().copy().unwrap());
                let out = gdn_conv_prep(
                    &proj.narrow(2, 0, c).unwrap(),
                    &proj.narrow(2, c + z, hv).unwrap(),
                    &proj.narrow(2, c + z + hv, hv).unwrap(),
                    &st,
                    &up(&taps),
                    &up(&dt_bias),
                    &up(&neg_a_exp),
                    d,
                )
                .unwrap();
                (out, st)
            };
            let (want, want_state) = run(&Device::Cpu);
            let (got, got_state) = run(&dev);
            let what = format!("gdn_conv_prep {d:?} B{batch} {dtype:?} (seed {seed:#x})");
            assert_eq!(
                values(&got_state),
                values(&want_state),
                "{what}: conv state"
            );
            for (name, g, w, tol) in [
                ("q", &got.q, &want.q, tolerance(dtype)),
                ("k", &got.k, &want.k, tolerance(dtype)),
                ("v", &got.v, &want.v, tolerance(dtype)),
                ("g", &got.g, &want.g, tolerance(DType::F32)),
                ("beta", &got.beta, &want.beta, tolerance(DType::F32)),
            ] {
                let e = rel_max(g, w);
                eprintln!("{what}: {name} rel err {e:.2e} (tol {tol:.0e})");
                assert!(e <= tol, "{what}: {name} rel err {e:e} > {tol:e}");
            }
        }
    }
}

/// The random inputs of one chunk: a merged projection `[B, S, C + Z + 2·Hv]` (qkv, b and a
/// are slices of it), a conv state, taps and the decay parameters, on the CPU.
struct Chunk {
    d: ConvPrepDims,
    proj: Tensor,
    state: Tensor,
    taps: Tensor,
    dt_bias: Tensor,
    neg_a_exp: Tensor,
}

impl Chunk {
    fn new(d: ConvPrepDims, batch: usize, tokens: usize, dtype: DType, seed: u64) -> Self {
        let (c, hv, kk) = (d.channels(), d.value_heads, d.kernel_size);
        let z = hv * d.value_dim;
        let mut r = Rng::xorshift(seed | 1);
        let proj = Tensor::cat(
            &[
                r.tensor(&[batch, tokens, c + z], -2.0, 2.0),
                r.tensor(&[batch, tokens, 2 * hv], -10.0, 10.0),
            ],
            2,
        )
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
        Self {
            d,
            proj,
            state: r
                .tensor(&[batch, kk - 1, c], -2.0, 2.0)
                .to_dtype(dtype)
                .unwrap(),
            taps: r.tensor(&[kk, c], -0.6, 0.6).to_dtype(dtype).unwrap(),
            dt_bias: r.tensor(&[hv], -1.0, 1.0),
            neg_a_exp: r.tensor(&[hv], -3.0, 2.5).exp().unwrap().neg().unwrap(),
        }
    }

    /// The op on `dev` over tokens `start .. start + len`, from `state` (already on `dev`).
    fn run(&self, dev: &Device, start: usize, len: usize, state: &Tensor) -> ConvPrepOut {
        let (c, hv) = (self.d.channels(), self.d.value_heads);
        let z = hv * self.d.value_dim;
        let up = |t: &Tensor| t.to_device(dev).unwrap();
        let proj = up(&self.proj).narrow(1, start, len).unwrap();
        gdn_conv_prep(
            &proj.narrow(2, 0, c).unwrap(),
            &proj.narrow(2, c + z, hv).unwrap(),
            &proj.narrow(2, c + z + hv, hv).unwrap(),
            state,
            &up(&self.taps),
            &up(&self.dt_bias),
            &up(&self.neg_a_exp),
            self.d,
        )
        .unwrap()
    }
}

#[test]
fn gdn_conv_prep_prefill_chunks_match_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0xC4A_2048);
    // (dims, B, S, from a conv state or from zeros)
    let cases = [
        // Qwen3-Next-80B-A3B, a 2048-token prefill chunk.
        (dims(16, 128, 32, 128, 4), 1, 2048, true),
        (dims(16, 128, 32, 128, 4), 1, 2048, false),
        (dims(16, 128, 32, 128, 4), 2, 37, true),
        // K = 4: S = K − 2, K − 1, K.
        (dims(16, 128, 32, 128, 4), 2, 2, true),
        (dims(16, 128, 32, 128, 4), 1, 3, true),
        (dims(16, 128, 32, 128, 4), 1, 4, false),
        // Edges: K = 8 with S < K − 1, head slots not a multiple of 4.
        (dims(1, 256, 3, 96, 8), 2, 5, true),
        (dims(2, 32, 4, 64, 2), 3, 300, true),
    ];
    for &(d, batch, tokens, with_state) in &cases {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let seed = rng.next();
            let mut chunk = Chunk::new(d, batch, tokens, dtype, seed);
            if !with_state {
                chunk.state = chunk.state.zeros_like().unwrap();
            }
            let what = format!(
                "gdn_conv_prep {d:?} B{batch} S{tokens} {dtype:?} state {with_state} (seed {seed:#x})"
            );
            let want = chunk.run(&Device::Cpu, 0, tokens, &chunk.state.copy().unwrap());
            let gpu_state = chunk.state.to_device(&dev).unwrap();
            let got = chunk.run(&dev, 0, tokens, &gpu_state);
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
    }
}

#[test]
fn gdn_conv_prep_prefill_gives_its_decode_steps_bit_for_bit_on_the_gpu() {
    let dev = gpu();
    for (d, tokens) in [(dims(16, 128, 32, 128, 4), 9), (dims(1, 256, 3, 96, 8), 5)] {
        for dtype in [DType::F32, DType::BF16] {
            let chunk = Chunk::new(d, 2, tokens, dtype, 0xDEC0DE);
            let what = format!("gdn_conv_prep {d:?} S{tokens} {dtype:?}");
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
    let chunk = Chunk::new(dims(16, 128, 32, 128, 4), 2, 3, DType::BF16, 7);
    let state = chunk.state.to_device(&dev).unwrap();
    let launches = gdn_ops::launches::count();
    let out = chunk.run(&dev, 1, 0, &state);
    assert_eq!(gdn_ops::launches::count(), launches);
    assert_eq!(out.q.dims(), [2, 0, 16, 128]);
    assert_eq!(out.g.dims(), [2, 0, 32]);
    assert_eq!(values(&out.conv_state), values(&chunk.state));
}
