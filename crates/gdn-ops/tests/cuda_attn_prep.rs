//! The CUDA `attn_prep_{f32,f16,bf16}` kernels (`kernels/attn_prep.cu`) against the CPU twin,
//! for every instantiation. Built only with the `cuda` feature and run on the GPU machine
//! (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Gates: `gate` and `values` (the whole buffer) bit for bit; `q` and `keys` (the whole
//! buffer) within 1 ulp of InT plus 1e-5 of max |ref| (CUDA's rsqrtf and sincosf differ from
//! the CPU's by a few f32 ulp).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::{close, gpu, tensor, values, Rng, TYPES};
use gdn_ops::ops::attn_prep::attn_prep;

#[test]
fn cuda_attn_prep_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    // (B, Nq, Nkv, Dh, R, cap, pos): Qwen3-Next-80B-A3B, long context, past the buffer,
    // full and odd rotations, Dh not a multiple of 32.
    let shapes = [
        (1, 16, 2, 256, 64, 256, 0),
        (1, 16, 2, 256, 64, 256, 200),
        (1, 16, 2, 256, 64, 4096, 4000),
        (1, 4, 2, 256, 64, 8, 8),
        (2, 4, 4, 64, 64, 16, 5),
        (3, 6, 2, 128, 32, 8, 7),
        (2, 2, 1, 96, 48, 4, 3),
    ];
    for (i, &(b, nq, nkv, dh, r, cap, pos)) in shapes.iter().enumerate() {
        for ty in TYPES {
            let mut rng = Rng::new(i as u64 * 31 + ty.code() as u64);
            let width = (2 * nq + 2 * nkv) * dh;
            let kv_shape = [b, nkv, cap, dh];
            let kv_len: usize = kv_shape.iter().product();
            let qkv = tensor(&rng.values(b * width, -3.0, 3.0, ty), &[b, width], ty);
            let qn = tensor(&rng.values(dh, 0.5, 1.5, ty), &[dh], ty);
            let kn = tensor(&rng.values(dh, 0.5, 1.5, ty), &[dh], ty);
            let freqs: Vec<f32> = (0..r / 2)
                .map(|i| 10_000_000f64.powf(-((2 * i) as f64) / r as f64) as f32)
                .collect();
            let freqs = Tensor::new(freqs.as_slice(), &Device::Cpu).unwrap();
            let keys = tensor(&rng.values(kv_len, -1.0, 1.0, ty), &kv_shape, ty);
            let vals = tensor(&rng.values(kv_len, -1.0, 1.0, ty), &kv_shape, ty);
            let pos_t = Tensor::new(&[pos as u32], &Device::Cpu).unwrap();
            let g = |t: &Tensor| t.to_device(&gpu).unwrap();
            let (keys_gpu, vals_gpu) = (g(&keys), g(&vals));
            let (q, gate) = attn_prep(
                &g(&qkv),
                &g(&qn),
                &g(&kn),
                1e-6,
                &g(&freqs),
                &g(&pos_t),
                &keys_gpu,
                &vals_gpu,
            )
            .unwrap();
            let (want_q, want_gate) =
                attn_prep(&qkv, &qn, &kn, 1e-6, &freqs, &pos_t, &keys, &vals).unwrap();
            let label = format!("attn_prep_{} {:?}", ty.name(), shapes[i]);
            if let Some(e) = close("q", &values(&q), &values(&want_q), ty, 1.0, 1e-5)
                .or_else(|| close("gate", &values(&gate), &values(&want_gate), ty, 0.0, 0.0))
                .or_else(|| close("keys", &values(&keys_gpu), &values(&keys), ty, 1.0, 1e-5))
                .or_else(|| close("values", &values(&vals_gpu), &values(&vals), ty, 0.0, 0.0))
            {
                failures.push(format!("{label}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
