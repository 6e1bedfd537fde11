//! The CUDA `attn_decode_{f32,f16,bf16}` kernels (`kernels/attn_decode.cu`) against the CPU
//! twin, for every instantiation, over the op's cases (tests/common/attn_decode.rs). Built
//! only with the `cuda` feature and run on the GPU machine (scripts/gpu/test-cuda.sh); without
//! a CUDA device every test fails.
//!
//! The split-K pass is chosen by capacity (`AttnDecodeDims::splits`), so the long shapes
//! run it; the simdgroup and split counts the emulated cases force are the emulation's. From
//! `LONG_CONTEXT_CAPACITY` positions on, rows of 16 bytes a lane take the long-context pair
//! (ops/attn_decode/long_context.rs): the 8k, 16k and 64k cases at Dh 256 in f16/bf16 and the
//! 8k case at Dh 128 in f32.
//!
//! Gate: within 2 ulp of InT plus 1e-5 of max |ref| (online softmax split over warps versus
//! the twin's two passes, then two roundings to InT).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::attn_decode::{cases, inputs, seed};
use common::{close, gpu, values, TYPES};
use gdn_ops::ops::attn_decode::attn_decode;

#[test]
fn cuda_attn_decode_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    for ty in TYPES {
        for (i, s) in cases().into_iter().enumerate() {
            let [q, gate, keys, vals] = inputs(s, ty, seed(i, ty)).tensors(s, ty);
            let pos_t = Tensor::new(&[s.pos as u32], &Device::Cpu).unwrap();
            let g = |t: &Tensor| t.to_device(&gpu).unwrap();
            let got = attn_decode(&g(&q), &g(&gate), &g(&keys), &g(&vals), &g(&pos_t)).unwrap();
            let want = attn_decode(&q, &gate, &keys, &vals, &pos_t).unwrap();
            assert_eq!(got.dims(), want.dims());
            if let Some(e) = close("out", &values(&got), &values(&want), ty, 2.0, 1e-5) {
                failures.push(format!("attn_decode_{} {s:?}: {e}", ty.name()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
