//! The CUDA `attn_decode_{f32,f16,bf16}` kernels (`kernels/attn_decode.cu`) against the CPU
//! twin, for every instantiation. Built only with the `cuda` feature and run on the GPU
//! machine (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! The split-K pass is chosen by capacity (`AttnDecodeDims::splits`), so the long shapes
//! below run it.
//!
//! Gate: within 2 ulp of InT plus 1e-5 of max |ref| (online softmax split over warps versus
//! the twin's two passes, then two roundings to InT).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::{close, gpu, tensor, values, Rng, TYPES};
use gdn_ops::ops::attn_decode::attn_decode;

#[test]
fn cuda_attn_decode_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    // (B, Nq, Nkv, Dh, cap, pos): Qwen3-Next-80B-A3B short and long, the first position,
    // GQA ratios 1 and 16, Dh 64 and 128, several sequences, pos past the buffer (clamped).
    // Capacities past SPLIT_KEYS (512) take the split-K pass: 2, 16 and 32 ranges, a context
    // far shorter than its buffers (empty ranges), the most ranges at 64k.
    let shapes = [
        (1, 16, 2, 256, 512, 300),
        (1, 16, 2, 256, 8192, 8000),
        (1, 16, 2, 256, 256, 0),
        (2, 4, 4, 128, 64, 63),
        (1, 16, 1, 64, 32, 20),
        (3, 8, 2, 64, 64, 44),
        (1, 2, 1, 64, 16, 40),
        (1, 4, 2, 128, 768, 600),
        (1, 16, 2, 256, 16384, 16000),
        (2, 8, 2, 64, 1536, 3),
        (1, 16, 2, 256, 65536, 65000),
    ];
    for (i, &(b, nq, nkv, dh, cap, pos)) in shapes.iter().enumerate() {
        for ty in TYPES {
            let mut rng = Rng::new(i as u64 * 131 + ty.code() as u64);
            let kv_shape = [b, nkv, cap, dh];
            let kv_len: usize = kv_shape.iter().product();
            let q = tensor(&rng.values(b * nq * dh, -1.0, 1.0, ty), &[b, nq, dh], ty);
            let gate = tensor(&rng.values(b * nq * dh, -4.0, 4.0, ty), &[b, nq * dh], ty);
            let keys = tensor(&rng.values(kv_len, -1.0, 1.0, ty), &kv_shape, ty);
            let vals = tensor(&rng.values(kv_len, -2.0, 2.0, ty), &kv_shape, ty);
            let pos_t = Tensor::new(&[pos as u32], &Device::Cpu).unwrap();
            let g = |t: &Tensor| t.to_device(&gpu).unwrap();
            let got = attn_decode(&g(&q), &g(&gate), &g(&keys), &g(&vals), &g(&pos_t)).unwrap();
            let want = attn_decode(&q, &gate, &keys, &vals, &pos_t).unwrap();
            assert_eq!(got.dims(), want.dims());
            if let Some(e) = close("out", &values(&got), &values(&want), ty, 2.0, 1e-5) {
                failures.push(format!("attn_decode_{} {:?}: {e}", ty.name(), shapes[i]));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
