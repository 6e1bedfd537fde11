//! The shipped `kernels/attn_prep.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for `attn_prep_{f32,f16,bf16}` and
//! compared with the CPU twin, [`gdn_ops::ops::attn_prep::attn_prep`].
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
use common::{close, failures, tensor, values, Input, Rng, Ty, TYPES};
use gdn_ops::ops::attn_prep::{attn_prep, AttnPrepParams};

static HARNESS: emu::Harness = emu::Harness::metal("attn_prep_harness");

#[derive(Clone, Copy, Debug)]
struct Shape {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_dims: usize,
    capacity: usize,
    pos: usize,
}

/// `theta^(-2i/R)` for `i < R/2`, as f32 (computed in f64 as the model's tables are).
fn inv_freq(rope_dims: usize, theta: f64) -> Vec<f32> {
    (0..rope_dims / 2)
        .map(|i| theta.powf(-((2 * i) as f64) / rope_dims as f64) as f32)
        .collect()
}

fn check(ty: Ty, s: Shape, seed: u64) -> Option<String> {
    let mut rng = Rng::new(seed);
    let width = (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim;
    let kv_len = s.batch * s.kv_heads * s.capacity * s.head_dim;
    let qkv = rng.values(s.batch * width, -3.0, 3.0, ty);
    let q_norm = rng.values(s.head_dim, 0.5, 1.5, ty);
    let k_norm = rng.values(s.head_dim, 0.5, 1.5, ty);
    let freqs = inv_freq(s.rope_dims, 10_000_000.0);
    let keys0 = rng.values(kv_len, -1.0, 1.0, ty);
    let values0 = rng.values(kv_len, -1.0, 1.0, ty);
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
    close("q", got_q, &values(&q), ty, 1.0, 1e-5)
        .or_else(|| close("gate", got_gate, &values(&gate), ty, 0.0, 0.0))
        .or_else(|| close("keys", got_keys, &values(&keys), ty, 1.0, 1e-5))
        .or_else(|| close("values", got_values, &values(&vals), ty, 0.0, 0.0))
}

#[test]
fn shipped_attn_prep_kernels_match_the_cpu_twin() {
    let shape = |batch, q_heads, kv_heads, head_dim, rope_dims, capacity, pos| Shape {
        batch,
        q_heads,
        kv_heads,
        head_dim,
        rope_dims,
        capacity,
        pos,
    };
    let shapes = [
        // Qwen3-Next-80B-A3B: Nq = 16, Nkv = 2, Dh = 256, R = 64; the first position, one
        // inside the buffer, its last slot, and a long-context one.
        shape(1, 16, 2, 256, 64, 256, 0),
        shape(1, 16, 2, 256, 64, 256, 137),
        shape(1, 16, 2, 256, 64, 256, 255),
        shape(1, 16, 2, 256, 64, 4096, 4000),
        // pos ≥ cap: nothing is written to the KV buffers.
        shape(1, 4, 2, 256, 64, 8, 8),
        // Full rotation, a rotated half not a multiple of 32 lanes, Dh not a multiple of 32,
        // no rotation, several sequences, GQA ratio 1 and 16.
        shape(2, 4, 4, 64, 64, 16, 5),
        shape(3, 6, 2, 128, 32, 8, 7),
        shape(2, 2, 1, 96, 48, 4, 3),
        shape(1, 4, 2, 64, 0, 4, 1),
        shape(1, 16, 1, 128, 64, 4, 2),
    ];
    let mut jobs = vec![];
    for (i, s) in shapes.iter().enumerate() {
        for ty in TYPES {
            jobs.push((ty, *s, (i as u64 + 1) * 104_729 + ty.code() as u64));
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
    let u = |f: &str| ("unsigned int".to_string(), f.to_string());
    assert_eq!(
        emu::params_fields("attn_prep.h", "AttnPrepParams"),
        [
            u("batch"),
            u("q_heads"),
            u("kv_heads"),
            u("head_dim"),
            u("rope_dims"),
            u("capacity"),
            ("float".to_string(), "eps".to_string())
        ],
        "AttnPrepParams (kernels/params/attn_prep.h) must match ops/attn_prep"
    );
    assert_eq!(std::mem::size_of::<AttnPrepParams>(), 28);
    let src = emu::shipped_source("kernels/attn_prep.metal");
    assert!(src.contains("#include \"params/attn_prep.h\""));
    let buffers = [
        "qkv", "q_norm", "k_norm", "inv_freq", "pos", "keys", "values", "q", "gate",
    ];
    for (i, name) in buffers.iter().enumerate() {
        assert!(
            src.contains(&format!(" {name} [[buffer({i})]]")),
            "attn_prep.metal: {name} must be buffer {i}"
        );
    }
    assert!(src.contains("AttnPrepParams& p [[buffer(9)]]"));
    for t in ["f32", "f16", "bf16"] {
        assert!(
            src.contains(&format!("(attn_prep_{t},")),
            "missing attn_prep_{t}"
        );
    }
    assert!(emu::shipped_source("kernels/attn_prep.cu").contains("#include \"params/attn_prep.h\""));
}
