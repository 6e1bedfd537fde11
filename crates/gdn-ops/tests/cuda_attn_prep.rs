//! The CUDA `attn_prep_{f32,f16,bf16}` kernels (`kernels/attn_prep.cu`) against the CPU twin,
//! for every instantiation, over the op's cases (tests/common/attn_prep.rs). Built only with
//! the `cuda` feature and run on the GPU machine (scripts/gpu/test-cuda.sh); without a CUDA
//! device every test fails.
//!
//! Gates: `gate` and `values` (the whole buffer) bit for bit; `q` and `keys` (the whole
//! buffer) within 1 ulp of InT plus 1e-5 of max |ref| (CUDA's rsqrtf and sincosf differ from
//! the CPU's by a few f32 ulp).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::attn_prep::{cases, inputs, inv_freq, kernel_gate, seed};
use common::{gpu, tensor, values, TYPES};
use gdn_ops::ops::attn_prep::attn_prep;

#[test]
fn cuda_attn_prep_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    for (i, s) in cases().into_iter().enumerate() {
        for ty in TYPES {
            let x = inputs(s, ty, seed(i, ty));
            let width = (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim;
            let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
            let qkv = tensor(&x.qkv, &[s.batch, width], ty);
            let qn = tensor(&x.q_norm, &[s.head_dim], ty);
            let kn = tensor(&x.k_norm, &[s.head_dim], ty);
            let freqs = Tensor::new(inv_freq(s.rope_dims).as_slice(), &Device::Cpu).unwrap();
            let keys = tensor(&x.keys, &kv_shape, ty);
            let vals = tensor(&x.values, &kv_shape, ty);
            let pos_t = Tensor::new(&[s.pos as u32], &Device::Cpu).unwrap();
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
            if let Some(e) = kernel_gate(
                ty,
                [
                    &values(&q),
                    &values(&gate),
                    &values(&keys_gpu),
                    &values(&vals_gpu),
                ],
                [
                    &values(&want_q),
                    &values(&want_gate),
                    &values(&keys),
                    &values(&vals),
                ],
            ) {
                failures.push(format!("attn_prep_{} {s:?}: {e}", ty.name()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
