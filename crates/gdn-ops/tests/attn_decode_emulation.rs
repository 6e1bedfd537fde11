//! The shipped `kernels/attn_decode.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`: threadgroup memory and barriers), run on the CPU for
//! `attn_decode_{f32,f16,bf16}` and compared with the CPU twin,
//! [`gdn_ops::ops::attn_decode::attn_decode`]; and the bodies of the shipped
//! `kernels/attn_decode.cu` the same way, on the CUDA stand-ins of `kernels/emu/cuda/`
//! (`kernels/emu/attn_decode_cuda_harness.cpp`), on the same cases.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`; without them this test fails, never
//! skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates, per case: every output within 2 ulp of InT of the twin's plus 1e-5 of max |ref|:
//! the online softmax, split over simdgroups, adds in another order than the twin's two-pass
//! softmax (the f32 part), and the output is rounded twice (the attention result, then its
//! product with the gate), either of which may land on the other side of a rounding
//! boundary. The KV positions after `pos` hold NaN, so a kernel that reads one fails.
//!
//! Split-K (`attn_decode_split_*` + `attn_decode_combine_*`) runs at the split count the host
//! picks from the capacity (contexts on both sides of [`SPLIT_KEYS`]) and at forced counts:
//! more ranges than keys (empty ranges), ranges not dividing the keys, the most ranges.

mod common;
mod emu;

use candle_core::{Device, Tensor};
use common::{close, failures, tensor, values, Input, Rng, Ty, TYPES};
use gdn_ops::ops::attn_decode::{
    attn_decode, AttnDecodeDims, AttnDecodeParams, MAX_SPLITS, SIMDGROUPS, SPLIT_KEYS,
};
use std::path::Path;

static METAL_HARNESS: emu::Harness = emu::Harness::metal("attn_decode_harness");

static CUDA_HARNESS: emu::Harness = emu::Harness::cuda("attn_decode_cuda_harness");

#[derive(Clone, Copy, Debug)]
struct Shape {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    pos: usize,
    simdgroups: usize,
    /// Key ranges (1: the one-pass kernel).
    splits: usize,
}

fn check(harness: &Path, ty: Ty, s: Shape, seed: u64) -> Option<String> {
    let mut rng = Rng::new(seed);
    let q_len = s.batch * s.q_heads * s.head_dim;
    let kv_len = s.batch * s.kv_heads * s.capacity * s.head_dim;
    // Scores of a few units: a softmax that is neither flat nor one-hot.
    let q = rng.values(q_len, -1.0, 1.0, ty);
    let gate = rng.values(q_len, -4.0, 4.0, ty);
    let (mut keys, mut vals) = (
        rng.values(kv_len, -1.0, 1.0, ty),
        rng.values(kv_len, -2.0, 2.0, ty),
    );
    // Positions past pos are not attended: NaN there poisons a kernel that reads them.
    for (i, (k, v)) in keys.iter_mut().zip(&mut vals).enumerate() {
        if (i / s.head_dim) % s.capacity > s.pos {
            (*k, *v) = (f32::NAN, f32::NAN);
        }
    }
    let scale = (s.head_dim as f32).powf(-0.5);
    let mut input = Input::new(b"ADECEMU1");
    input.u32(ty.code());
    for v in [
        s.batch,
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        s.capacity,
        s.pos,
        s.simdgroups,
        s.splits,
    ] {
        input.u32(v as u32);
    }
    input
        .f32(scale)
        .f32s(&q)
        .f32s(&gate)
        .f32s(&keys)
        .f32s(&vals);
    let got = match emu::run_harness(harness, &input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
    let want = attn_decode(
        &tensor(&q, &[s.batch, s.q_heads, s.head_dim], ty),
        &tensor(&gate, &[s.batch, s.q_heads * s.head_dim], ty),
        &tensor(&keys, &kv_shape, ty),
        &tensor(&vals, &kv_shape, ty),
        &Tensor::new(&[s.pos as u32], &Device::Cpu).unwrap(),
    )
    .unwrap();
    close("out", &got, &values(&want), ty, 2.0, 1e-5)
}

#[test]
fn shipped_attn_decode_kernels_match_the_cpu_twin() {
    run_all(METAL_HARNESS.path(), "metal");
}

#[test]
fn shipped_cuda_attn_decode_bodies_match_the_cpu_twin() {
    run_all(CUDA_HARNESS.path(), "cuda");
}

fn run_all(harness: &Path, kind: &str) {
    let shape = |batch, q_heads, kv_heads, head_dim, capacity, pos, simdgroups| {
        // The split count the host picks for this capacity.
        let dims = AttnDecodeDims {
            batch,
            q_heads,
            kv_heads,
            head_dim,
            capacity,
        };
        Shape {
            batch,
            q_heads,
            kv_heads,
            head_dim,
            capacity,
            pos,
            simdgroups,
            splits: dims.splits(),
        }
    };
    let split = |s: Shape, splits| Shape { splits, ..s };
    let s = SIMDGROUPS;
    let shapes = [
        // Qwen3-Next-80B-A3B: Nq = 16, Nkv = 2, Dh = 256, a few hundred cached positions.
        shape(1, 16, 2, 256, 512, 300, s),
        // The first position (most simdgroups see no key), fewer keys than simdgroups, a
        // count of keys not a multiple of them.
        shape(1, 4, 2, 256, 256, 0, s),
        shape(1, 4, 1, 128, 8, 5, s),
        shape(2, 8, 2, 64, 64, 44, s),
        // GQA ratios 1 and 16, Dh 32, several sequences, one simdgroup, and 4.
        shape(2, 4, 4, 128, 32, 31, s),
        shape(1, 16, 1, 64, 32, 20, s),
        shape(3, 2, 1, 32, 16, 9, s),
        shape(1, 4, 2, 256, 64, 40, 1),
        shape(1, 4, 2, 128, 64, 63, 4),
        // pos past the buffer: clamped to its last position.
        shape(1, 2, 1, 64, 16, 40, s),
        // Split-K: one range at SPLIT_KEYS, two past it (the host's choice), ranges of 701 and
        // 700 keys; the buffers far longer than the context (ranges of ceil(41 / 3)).
        shape(1, 4, 2, 128, SPLIT_KEYS, SPLIT_KEYS - 1, s),
        shape(1, 4, 2, 128, SPLIT_KEYS + 256, 700, s),
        shape(2, 8, 2, 64, 1536, 1400, s),
        shape(1, 4, 1, 64, 1536, 40, s),
        // Forced: more ranges than keys (empty ranges), the first position, ranges not
        // dividing the keys, pos past the buffer, the most ranges, Dh 256 with 4 simdgroups.
        split(shape(1, 4, 2, 128, 64, 5, s), 8),
        split(shape(1, 2, 1, 64, 16, 0, s), 3),
        split(shape(2, 4, 4, 32, 100, 98, s), 7),
        split(shape(1, 2, 1, 64, 16, 40, s), 5),
        split(shape(1, 2, 2, 64, 4096, 4000, s), MAX_SPLITS),
        split(shape(1, 4, 2, 256, 300, 299, 4), 4),
    ];
    let mut jobs = vec![];
    for (i, s) in shapes.iter().enumerate() {
        for ty in TYPES {
            jobs.push((ty, *s, (i as u64 + 1) * 15_485_863 + ty.code() as u64));
        }
    }
    let failures: Vec<String> = failures(&jobs, |&(ty, s, seed)| {
        check(harness, ty, s, seed).map(|e| format!("{kind} attn_decode_{} {s:?}: {e}", ty.name()))
    });
    common::assert_no_failures(&failures, jobs.len(), "cases fail");
}

/// What the C++ build cannot see: the buffer and threadgroup-memory indices, the parameter
/// struct the host mirrors, and the instantiation names.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "attn_decode.h",
        "AttnDecodeParams",
        &[
            "batch",
            "q_heads",
            "kv_heads",
            "head_dim",
            "capacity",
            "simdgroups",
            "splits",
            "float scale",
        ],
    );
    assert_eq!(std::mem::size_of::<AttnDecodeParams>(), 32);
    let src = emu::shipped_source("kernels/attn_decode.metal");
    assert!(src.contains("#include \"params/attn_decode.h\""));
    for (i, name) in ["q", "gate", "keys", "values", "pos", "out"]
        .iter()
        .enumerate()
    {
        assert!(
            src.contains(&format!(" {name} [[buffer({i})]]")),
            "attn_decode.metal: {name} must be buffer {i}"
        );
    }
    assert!(src.contains("AttnDecodeParams& p [[buffer(6)]]"));
    assert!(src.contains("threadgroup float* scratch [[threadgroup(0)]]"));
    for (i, name) in ["q", "keys", "values", "pos", "partials"]
        .iter()
        .enumerate()
    {
        assert!(
            src.contains(&format!(" {name} [[buffer({i})]]")),
            "attn_decode_split: {name} must be buffer {i}"
        );
    }
    assert!(src.contains("AttnDecodeParams& p [[buffer(5)]]"));
    for (i, name) in ["partials", "gate", "out"].iter().enumerate() {
        assert!(
            src.contains(&format!(" {name} [[buffer({i})]]")),
            "attn_decode_combine: {name} must be buffer {i}"
        );
    }
    assert!(src.contains("AttnDecodeParams& p [[buffer(3)]]"));
    for t in ["f32", "f16", "bf16"] {
        for kernel in ["attn_decode", "attn_decode_split", "attn_decode_combine"] {
            assert!(
                src.contains(&format!("({kernel}_{t},")),
                "missing {kernel}_{t}"
            );
        }
    }
    let cu = emu::shipped_source("kernels/attn_decode.cu");
    assert!(cu.contains("#include \"params/attn_decode.h\""));
    // The names ops/attn_decode/cuda.rs launches.
    for kernel in ["attn_decode", "attn_decode_split", "attn_decode_combine"] {
        assert!(
            cu.contains(&format!(" {kernel}_##TN(")),
            "attn_decode.cu: missing {kernel}_<t>"
        );
    }
}
