//! The shipped `kernels/attn_prep.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for `attn_prep_{f32,f16,bf16}` and
//! compared with the CPU twin, [`gdn_ops::ops::attn_prep::attn_prep`], over the op's cases
//! (tests/common/attn_prep.rs).
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`; without them this test fails, never
//! skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates, per case: `gate` and `values` (the whole buffer) bit for bit the twin's (copies);
//! `q` and `keys` (the whole buffer: only row `pos` may change, none when `pos ≥ cap`) within
//! 1 ulp of InT plus 1e-5 of max |ref| (f32 sums of squares in another order, cos/sin the
//! same C library functions on the same f32 angles).

mod common;
mod emu;

use candle_core::{Device, Tensor};
use common::attn_prep::{cases, inputs, inv_freq, kernel_gate, seed, Inputs, Shape};
use common::{failures, tensor, values, Input, Ty, TYPES};
use gdn_ops::ops::attn_prep::{attn_prep, AttnPrepParams};

static HARNESS: emu::Harness = emu::Harness::metal("attn_prep_harness");

fn check(ty: Ty, s: Shape, seed: u64) -> Option<String> {
    let width = (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim;
    let kv_len = s.batch * s.kv_heads * s.capacity * s.head_dim;
    let Inputs {
        qkv,
        q_norm,
        k_norm,
        keys: keys0,
        values: values0,
    } = inputs(s, ty, seed);
    let freqs = inv_freq(s.rope_dims);
    let eps = 1e-6;
    let mut input = Input::new(b"APREPEM1");
    input.u32(ty.code());
    for v in [
        s.batch,
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        s.rope_dims,
        s.capacity,
        s.pos,
    ] {
        input.u32(v as u32);
    }
    input
        .f32(eps)
        .f32s(&qkv)
        .f32s(&q_norm)
        .f32s(&k_norm)
        .f32s(&freqs)
        .f32s(&keys0)
        .f32s(&values0);
    let got = match HARNESS.run(&input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
    let keys = tensor(&keys0, &kv_shape, ty);
    let vals = tensor(&values0, &kv_shape, ty);
    let pos = Tensor::new(&[s.pos as u32], &Device::Cpu).unwrap();
    let freqs_t = Tensor::new(freqs.as_slice(), &Device::Cpu).unwrap();
    let (q, gate) = attn_prep(
        &tensor(&qkv, &[s.batch, width], ty),
        &tensor(&q_norm, &[s.head_dim], ty),
        &tensor(&k_norm, &[s.head_dim], ty),
        eps,
        &freqs_t,
        &pos,
        &keys,
        &vals,
    )
    .unwrap();
    let q_len = s.batch * s.q_heads * s.head_dim;
    if got.len() != 2 * q_len + 2 * kv_len {
        return Some(format!("the harness printed {} values", got.len()));
    }
    let (got_q, rest) = got.split_at(q_len);
    let (got_gate, rest) = rest.split_at(q_len);
    let (got_keys, got_values) = rest.split_at(kv_len);
    kernel_gate(
        ty,
        [got_q, got_gate, got_keys, got_values],
        [&values(&q), &values(&gate), &values(&keys), &values(&vals)],
    )
}

#[test]
fn shipped_attn_prep_kernels_match_the_cpu_twin() {
    let mut jobs = vec![];
    for (i, s) in cases().into_iter().enumerate() {
        for ty in TYPES {
            jobs.push((ty, s, seed(i, ty)));
        }
    }
    HARNESS.path();
    let failures: Vec<String> = failures(&jobs, |&(ty, s, seed)| {
        check(ty, s, seed).map(|e| format!("attn_prep_{} {s:?}: {e}", ty.name()))
    });
    common::assert_no_failures(&failures, jobs.len(), "cases fail");
}

/// What the C++ build cannot see: the buffer indices, the parameter struct the host
/// mirrors, and the instantiation names.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "attn_prep.h",
        "AttnPrepParams",
        &[
            "batch",
            "q_heads",
            "kv_heads",
            "head_dim",
            "rope_dims",
            "capacity",
            "float eps",
        ],
    );
    assert_eq!(std::mem::size_of::<AttnPrepParams>(), 28);
    let src = emu::shipped_source_including("kernels/attn_prep.metal", "attn_prep.h");
    let buffers = [
        "qkv", "q_norm", "k_norm", "inv_freq", "pos", "keys", "values", "q", "gate",
    ];
    emu::assert_buffer_indices(&src, "attn_prep.metal", &buffers, " ");
    assert!(src.contains("AttnPrepParams& p [[buffer(9)]]"));
    emu::assert_instantiated(&src, "attn_prep");
    emu::shipped_source_including("kernels/attn_prep.cu", "attn_prep.h");
}
