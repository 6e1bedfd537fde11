//! The shipped `kernels/attn_decode.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`: threadgroup memory and barriers), run on the CPU for
//! `attn_decode_{f32,f16,bf16}` and compared with the CPU twin,
//! [`gdn_ops::ops::attn_decode::attn_decode`]; and the bodies of the shipped
//! `kernels/attn_decode.cu` the same way, on the CUDA stand-ins of `kernels/emu/cuda/`
//! (`kernels/emu/attn_decode_cuda_harness.cpp`), on the same cases: the op's
//! (tests/common/attn_decode.rs) up to the emulator's work bound.
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
//! picks from the capacity (contexts on both sides of `SPLIT_KEYS`) and at forced counts:
//! more ranges than keys (empty ranges), ranges not dividing the keys, the most ranges. The
//! long-context split passes of the CUDA file (`attn_decode_split_{pipelined,pair}_*` and
//! `attn_decode_combine_wide_*`) run on every split case whose rows they take.

mod common;
mod emu;

use candle_core::{Device, Tensor};
use common::attn_decode::{cases, inputs, seed, Shape, EMULATION_MAX_WORK};
use common::{close, failures, values, Input, Ty, TYPES};
use gdn_ops::ops::attn_decode::long_context::SplitPasses;
use gdn_ops::ops::attn_decode::{attn_decode, AttnDecodeParams};
use std::path::Path;

static METAL_HARNESS: emu::Harness = emu::Harness::metal("attn_decode_harness");

static CUDA_HARNESS: emu::Harness = emu::Harness::cuda("attn_decode_cuda_harness");

/// The long-context split passes (`run_pipelined`, `combine_wide`): a query head a block, and
/// head pairs (cases whose GQA group is even).
static CUDA_PIPELINED: emu::Harness =
    emu::Harness::cuda_with("attn_decode_cuda_harness", &["-DATTN_DECODE_HEADS=1"]);
static CUDA_PAIR: emu::Harness =
    emu::Harness::cuda_with("attn_decode_cuda_harness", &["-DATTN_DECODE_HEADS=2"]);

fn check(harness: &Path, i: usize, ty: Ty, s: Shape) -> Option<String> {
    let mut x = inputs(s, ty, seed(i, ty));
    // Positions past pos are not attended: NaN there poisons a kernel that reads them.
    for (i, (k, v)) in x.keys.iter_mut().zip(&mut x.values).enumerate() {
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
        .f32s(&x.q)
        .f32s(&x.gate)
        .f32s(&x.keys)
        .f32s(&x.values);
    let got = match emu::run_harness(harness, &input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let [q, gate, keys, vals] = x.tensors(s, ty);
    let pos = Tensor::new(&[s.pos as u32], &Device::Cpu).unwrap();
    let want = attn_decode(&q, &gate, &keys, &vals, &pos).unwrap();
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

/// The long-context passes on every split case whose rows they take (16 bytes a lane: Dh 256
/// in f16/bf16, Dh 128 in f32), whatever its capacity: the host launches them from
/// `LONG_CONTEXT_CAPACITY` on, which the emulator's work bound would leave few cases of.
#[test]
fn shipped_cuda_long_context_split_bodies_match_the_cpu_twin() {
    let rows_of_16_bytes =
        |s: Shape, ty: Ty| s.splits > 1 && s.head_dim / 32 * ty.dtype().size_in_bytes() == 16;
    run_cases(CUDA_PIPELINED.path(), "pipelined", rows_of_16_bytes);
    run_cases(CUDA_PAIR.path(), "pair", |s, ty| {
        rows_of_16_bytes(s, ty) && (s.q_heads / s.kv_heads).is_multiple_of(2)
    });
}

/// The op's cases the emulator runs in time ([`EMULATION_MAX_WORK`]), at every type.
fn run_all(harness: &Path, kind: &str) {
    run_cases(harness, kind, |_, _| true);
}

/// The cases of [`run_all`] that `takes` keeps.
fn run_cases(harness: &Path, kind: &str, takes: impl Fn(Shape, Ty) -> bool) {
    let mut jobs = vec![];
    for (i, s) in cases().into_iter().enumerate() {
        if s.work() <= EMULATION_MAX_WORK {
            jobs.extend(
                TYPES
                    .map(|ty| (i, ty, s))
                    .into_iter()
                    .filter(|&(_, ty, s)| takes(s, ty)),
            );
        }
    }
    assert!(!jobs.is_empty(), "{kind}: no case");
    let failures: Vec<String> = failures(&jobs, |&(i, ty, s)| {
        check(harness, i, ty, s).map(|e| format!("{kind} attn_decode_{} {s:?}: {e}", ty.name()))
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
    let src = emu::shipped_source_including("kernels/attn_decode.metal", "attn_decode.h");
    let buffers = ["q", "gate", "keys", "values", "pos", "out"];
    emu::assert_buffer_indices(&src, "attn_decode.metal", &buffers, " ");
    assert!(src.contains("AttnDecodeParams& p [[buffer(6)]]"));
    assert!(src.contains("threadgroup float* scratch [[threadgroup(0)]]"));
    let buffers = ["q", "keys", "values", "pos", "partials"];
    emu::assert_buffer_indices(&src, "attn_decode_split", &buffers, " ");
    assert!(src.contains("AttnDecodeParams& p [[buffer(5)]]"));
    let buffers = ["partials", "gate", "out"];
    emu::assert_buffer_indices(&src, "attn_decode_combine", &buffers, " ");
    assert!(src.contains("AttnDecodeParams& p [[buffer(3)]]"));
    for kernel in ["attn_decode", "attn_decode_split", "attn_decode_combine"] {
        emu::assert_instantiated(&src, kernel);
    }
    let cu = emu::shipped_source_including("kernels/attn_decode.cu", "attn_decode.h");
    // The names ops/attn_decode/cuda.rs launches.
    for kernel in ["attn_decode", "attn_decode_split", "attn_decode_combine"] {
        assert!(
            cu.contains(&format!(" {kernel}_##TN(")),
            "attn_decode.cu: missing {kernel}_<t>"
        );
    }
    // The long-context pair (ops/attn_decode/long_context.rs): the split pass through the
    // ATTN_DECODE_PIPELINED macro, the combine as above.
    for passes in [SplitPasses::Pipelined, SplitPasses::HeadPairs] {
        let k = passes.kernels(256);
        let variant = k
            .split
            .strip_prefix("attn_decode_split_")
            .expect("a split pass");
        let heads = k.heads_per_block;
        assert!(
            cu.contains(&format!("ATTN_DECODE_PIPELINED(TN, T, {variant}, {heads},")),
            "attn_decode.cu: missing {}_<t> over {heads} heads a block",
            k.split
        );
        assert!(
            cu.contains(&format!(" {}_##TN(", k.combine)),
            "attn_decode.cu: missing {}_<t>",
            k.combine
        );
    }
}
