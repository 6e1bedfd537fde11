//! The slot entries of the shipped `kernels/attn_decode.cu` (`attn_decode::run_slot`,
//! `attn_decode::combine_slot`: `attn_decode_slots_*`, `attn_decode_combine_slots_*`), run on
//! the CUDA stand-ins of `kernels/emu/cuda/` (`kernels/emu/attn_decode_slots_cuda_harness.cpp`),
//! against each sequence's own launch of the per-sequence bodies on the same emulator
//! (`kernels/emu/attn_decode_cuda_harness.cpp`: one pass, the shipped split pair, or the
//! long-context passes), **bit for bit**: what the batched decode step needs for each sequence
//! to get its own tokens. One launch holds sequences of every kind (one pass, shipped split,
//! pipelined, head pairs), each with its own capacity, position and number of key ranges
//! (more ranges than keys included); the KV positions after each position hold NaN, and the
//! split records start NaN, so a body that reads another sequence's buffers or records, or
//! one past its position, fails. The GPU test (`tests/cuda_state_slots.rs`) checks the same
//! against the per-sequence CUDA launches.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`; without them this test fails, never
//! skips. `GDN_EMU_CXX` overrides the compiler.

mod common;
mod emu;

use common::{failures, Input, Rng, Ty};

static SLOTS: emu::Harness = emu::Harness::cuda("attn_decode_slots_cuda_harness");
static SINGLE: emu::Harness = emu::Harness::cuda("attn_decode_cuda_harness");
static PIPELINED: emu::Harness =
    emu::Harness::cuda_with("attn_decode_cuda_harness", &["-DATTN_DECODE_HEADS=1"]);
static PAIR: emu::Harness =
    emu::Harness::cuda_with("attn_decode_cuda_harness", &["-DATTN_DECODE_HEADS=2"]);

/// `attn_decode::kSingle` .. `kPairs` (the host's `attn_decode_slots::passes`).
const SINGLE_PASS: u32 = 0;
const SHIPPED: u32 = 1;
const PIPELINED_PASS: u32 = 2;
const PAIRS: u32 = 3;

/// A sequence: KV capacity, position, key ranges, passes.
type Seq = (usize, usize, usize, u32);

/// A launch: type, Nq, Nkv, Dh, warps a block, its sequences.
struct Case {
    ty: Ty,
    nq: usize,
    nkv: usize,
    dh: usize,
    simdgroups: usize,
    seqs: Vec<Seq>,
}

fn cases() -> Vec<Case> {
    let case = |ty, (nq, nkv, dh), simdgroups, seqs| Case {
        ty,
        nq,
        nkv,
        dh,
        simdgroups,
        seqs,
    };
    vec![
        // Rows of 16 bytes a lane (f32 at Dh 128): every kind in one launch.
        case(
            Ty::F32,
            (4, 2, 128),
            4,
            vec![
                (40, 39, 1, SINGLE_PASS),
                (200, 150, 2, SHIPPED),
                (300, 299, 3, PIPELINED_PASS),
                (260, 200, 5, PAIRS),
            ],
        ),
        // Qwen3-Next's head dim in bf16.
        case(
            Ty::Bf16,
            (4, 2, 256),
            8,
            vec![
                (130, 129, 2, PIPELINED_PASS),
                (64, 10, 1, SINGLE_PASS),
                (200, 199, 4, PAIRS),
            ],
        ),
        // An odd GQA group, f16 rows of 4 bytes a lane: the shipped split, with more ranges
        // than keys in one sequence.
        case(
            Ty::F16,
            (6, 2, 64),
            2,
            vec![
                (33, 32, 1, SINGLE_PASS),
                (150, 149, 2, SHIPPED),
                (70, 5, 7, SHIPPED),
            ],
        ),
    ]
}

/// The inputs of a case: q and gate of every sequence, each sequence's keys and values with
/// NaN past its position.
struct Inputs {
    q: Vec<f32>,
    gate: Vec<f32>,
    kv: Vec<(Vec<f32>, Vec<f32>)>,
}

fn inputs(c: &Case, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let rows = c.seqs.len() * c.nq * c.dh;
    let q = rng.values(rows, -1.0, 1.0, c.ty);
    let gate = rng.values(rows, -4.0, 4.0, c.ty);
    let kv = c
        .seqs
        .iter()
        .map(|&(cap, pos, _, _)| {
            let n = c.nkv * cap * c.dh;
            let mut keys = rng.values(n, -1.0, 1.0, c.ty);
            let mut values = rng.values(n, -2.0, 2.0, c.ty);
            for (i, (k, v)) in keys.iter_mut().zip(&mut values).enumerate() {
                if (i / c.dh) % cap > pos {
                    (*k, *v) = (f32::NAN, f32::NAN);
                }
            }
            (keys, values)
        })
        .collect();
    Inputs { q, gate, kv }
}

/// The slot launch's output, `[B, Nq·Dh]`.
fn slots(c: &Case, x: &Inputs) -> Result<Vec<f32>, String> {
    let mut input = Input::new(b"ADSLEMU1");
    input.u32(c.ty.code());
    for v in [c.seqs.len(), c.nq, c.nkv, c.dh, c.simdgroups] {
        input.u32(v as u32);
    }
    input.f32((c.dh as f32).powf(-0.5));
    for &(cap, pos, splits, passes) in &c.seqs {
        input
            .u32(cap as u32)
            .u32(pos as u32)
            .u32(splits as u32)
            .u32(passes);
    }
    input.f32s(&x.q).f32s(&x.gate);
    for (k, v) in &x.kv {
        input.f32s(k).f32s(v);
    }
    SLOTS.run(&input.0)
}

/// Sequence `i`'s own launch of the per-sequence bodies its passes name.
fn alone(c: &Case, x: &Inputs, i: usize) -> Result<Vec<f32>, String> {
    let (cap, pos, splits, passes) = c.seqs[i];
    let row = c.nq * c.dh;
    let mut input = Input::new(b"ADECEMU1");
    input.u32(c.ty.code());
    for v in [1, c.nq, c.nkv, c.dh, cap, pos, c.simdgroups, splits] {
        input.u32(v as u32);
    }
    input
        .f32((c.dh as f32).powf(-0.5))
        .f32s(&x.q[i * row..][..row])
        .f32s(&x.gate[i * row..][..row])
        .f32s(&x.kv[i].0)
        .f32s(&x.kv[i].1);
    let harness = match passes {
        PIPELINED_PASS => &PIPELINED,
        PAIRS => &PAIR,
        _ => &SINGLE,
    };
    harness.run(&input.0)
}

#[test]
fn attn_decode_slot_bodies_are_each_sequences_own_launch() {
    let cases = cases();
    let failures: Vec<String> = failures(&(0..cases.len()).collect::<Vec<_>>(), |&ci| {
        let c = &cases[ci];
        let x = inputs(c, 900 + ci as u64);
        let got = match slots(c, &x) {
            Ok(v) => v,
            Err(e) => return Some(format!("case {ci}: slots: {e}")),
        };
        let row = c.nq * c.dh;
        for i in 0..c.seqs.len() {
            let want = match alone(c, &x, i) {
                Ok(v) => v,
                Err(e) => return Some(format!("case {ci} sequence {i}: alone: {e}")),
            };
            let got = &got[i * row..][..row];
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if differ > 0 || got.iter().any(|v| v.is_nan()) {
                return Some(format!(
                    "case {ci} sequence {i} {:?}: {differ} of {row} values differ from its own launch",
                    c.seqs[i]
                ));
            }
        }
        None
    });
    common::assert_no_failures(&failures, cases.len(), "cases fail");
}

/// The table row the host writes (`SLOT_WORDS` eight-byte words) is the kernel's `Slot`.
#[test]
fn slot_row_in_source() {
    let cu = emu::shipped_source_including("kernels/attn_decode.cu", "attn_decode.h");
    let slot = &cu[cu
        .find("struct Slot {")
        .expect("attn_decode.cu: struct Slot")..];
    let slot = &slot[..slot.find("};").unwrap()];
    let fields = slot.matches(';').count();
    assert_eq!(
        fields,
        gdn_ops::ops::attn_decode_slots::SLOT_WORDS,
        "{slot}"
    );
    for kernel in ["attn_decode_slots", "attn_decode_combine_slots"] {
        assert!(
            cu.contains(&format!(" {kernel}_##TN(")),
            "attn_decode.cu: missing {kernel}_<t>"
        );
    }
}
