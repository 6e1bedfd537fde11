//! The body of the shipped grouped quantized GEMM, `kernels/affine_grouped.cu`
//! (`affine_grouped::grouped_kernel`: wmma m16n16k16 f16/bf16 tensor-core products, FMA for
//! f32, x tiles double-buffered with cp.async, which the emulation defers to each thread's
//! wait), compiled as C++ with clang-19 on top of the Metal emulation plus the CUDA stand-ins
//! (`kernels/emu/cuda/`), run on the CPU with the host's own tile schedule
//! (`kernels/emu/affine_grouped_cuda_harness.cpp`) and compared with the CPU twin,
//! [`AffineTensor::grouped_matmul_t`] on the CPU. What it cannot check is the GPU itself
//! (timing, the real fragment layouts): `tests/cuda_affine_grouped.rs` does, on the H100.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`, like the other emulation tests; it
//! never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gate: every element within 1 ulp of the activation type at the twin's value plus 1e-5 of
//! max |y| (both sides round the same weights once and sum in f32, in different orders), and
//! every element written (the harness fails on an unwritten one). The cases: the op's
//! (tests/common/affine_grouped.rs) that the kernel covers, some at every tile height; and the
//! split-K dense case (`ops/affine_grouped/split_k.rs`: one matrix, 9–64 rows, the body over
//! column slices into an f32 workspace, every plane of which must be written, then the shipped
//! fixed-order sum) at the host's slicing and at forced ones (uneven last slice, a last step
//! of 32 columns).

mod common;
mod emu;

use candle_core::{DType, Device, Tensor};
use common::affine::send_matrix;
use common::affine_grouped::{
    cases as op_cases, inputs, row_offsets, seed, Case as OpCase, EMULATION_MAX_WORK,
};
use common::{close, failures, random_matrix, values, Input, Rng, Ty};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::affine_grouped::{
    tile_pairs_for, tile_schedule, SMEM_BYTES, SPAN_COLS, THREADS, TILE_COLS, TILE_PAIRS,
    TILE_PAIRS_CHOICES, TILE_ROWS,
};

static HARNESS: emu::Harness = emu::Harness::cuda("affine_grouped_cuda_harness");

/// A case of the op's with the emulation's own tile height.
struct Case {
    op: OpCase,
    /// Its index in the op's cases (the inputs' seed).
    index: usize,
    /// The tile height, or `None` for the host's choice.
    tile_pairs: Option<usize>,
    /// Split-K steps per slice (0: the one-launch kernel).
    slice_steps: usize,
}

/// Runs the kernel's body on one case; `None` when it matches the twin.
fn check(case: &Case) -> Option<String> {
    let c = &case.op;
    let inputs = inputs(c, seed(case.index));
    let (m, offsets) = (&inputs.m, &inputs.offsets);
    let (experts, pairs) = (c.counts.len(), c.pairs());
    let x = inputs.x_tensor(c);
    let twin = AffineTensor::upload(m, &Device::Cpu).unwrap();
    let want = values(&twin.grouped_matmul_t(&x, offsets).unwrap());
    let tile_pairs = case.tile_pairs.unwrap_or_else(|| tile_pairs_for(offsets));
    let schedule = tile_schedule(offsets, tile_pairs);
    let mut input = Input::new(b"AGQCUDA1");
    for v in [
        experts,
        c.rows,
        c.cols,
        c.bits,
        c.group,
        pairs,
        schedule.len() / 3,
        tile_pairs,
        case.slice_steps,
    ] {
        input.u32(v as u32);
    }
    send_matrix(&mut input, (c.x, c.scales), m);
    input.f32s(&inputs.x);
    schedule.iter().for_each(|&t| {
        input.u32(t);
    });
    let what = match case.slice_steps {
        0 => format!("{} tiles of {tile_pairs}", c.label()),
        s => format!("{} split-K slices of {s} steps", c.label()),
    };
    match HARNESS.run(&input.0) {
        Err(e) => Some(format!("{what}: {e}")),
        Ok(got) => {
            let result = close(&what, &got, &want, c.x, 1.0, 1e-5);
            if result.is_none() {
                eprintln!("{what}: ok");
            }
            result
        }
    }
}

/// The op's cases (tests/common/affine_grouped.rs) that the kernel covers (2, 4 and 8 bits:
/// the host runs the others per expert) and the emulator runs in time
/// ([`EMULATION_MAX_WORK`]), at the host's tile height and, for the first instantiation
/// cases, at every tile height.
fn cases() -> Vec<Case> {
    let mut cases = vec![];
    for (index, op) in op_cases().into_iter().enumerate() {
        if !matches!(op.bits, 2 | 4 | 8) || op.work() > EMULATION_MAX_WORK {
            continue;
        }
        // Experts without pairs first and last, one pair, a count that crosses a tile (70 =
        // 64 + 6), rows that are not a multiple of the block's 128; and counts that leave
        // whole 16-pair fragments of a tile empty (40 of 64, 17 of 32 or 64): at every tile
        // height.
        let every_height = [&[0, 1, 70, 3, 0][..], &[40, 17, 0, 2]].contains(&&op.counts[..]);
        let heights: Vec<Option<usize>> = if every_height {
            TILE_PAIRS_CHOICES.map(Some).to_vec()
        } else {
            vec![None]
        };
        for tile_pairs in heights {
            cases.push(Case {
                op: op.clone(),
                index,
                tile_pairs,
                slice_steps: 0,
            });
        }
    }
    cases
}

/// The split-K dense cases (tests/common/affine_grouped.rs, shared with the Metal kernel's
/// emulation).
fn split_cases() -> Vec<Case> {
    common::affine_grouped::split_cases()
        .into_iter()
        .map(|c| Case {
            op: c.op,
            index: c.index,
            tile_pairs: None,
            slice_steps: c.slice_steps,
        })
        .collect()
}

#[test]
fn split_k_matches_the_cpu_twin() {
    let cases = split_cases();
    common::assert_no_failures(&failures(&cases, check), cases.len(), "split-K cases fail");
}

#[test]
fn shipped_kernel_matches_the_cpu_twin() {
    let cases = cases();
    common::assert_no_failures(&failures(&cases, check), cases.len(), "cases fail");
}

/// The kernel's tile constants, as the host mirrors them.
#[test]
fn tile_constants_match_the_host() {
    let flat = emu::shipped_source("kernels/affine_grouped.cu");
    for (name, value) in [
        ("kTileM", TILE_PAIRS),
        ("kTileN", TILE_ROWS),
        ("kTileK", TILE_COLS),
        ("kSpan", SPAN_COLS),
        ("kWarps", THREADS / 32),
    ] {
        let line = format!("constexpr int {name} = {value};");
        assert!(flat.contains(&line), "missing `{line}`");
    }
    assert!(flat.contains("constexpr int kThreads = kWarps * 32;"));
    assert!(flat.contains("constexpr int kLdK = kTileK + 8;"));
    assert!(flat.contains("constexpr int kStageElems = (kTileM + kTileN) * kLdK;"));
    assert!(flat.contains("constexpr int kSmemBytes = 2 * kStageElems * 2;"));
    assert_eq!(
        SMEM_BYTES,
        2 * (TILE_PAIRS + TILE_ROWS) * (TILE_COLS + 8) * 2
    );
}

/// What the C++ build cannot see: the entry points the host looks up, and the parameter struct
/// passed by value, which the host mirrors (`AffineGroupedParams`, ops/affine_grouped/mod.rs).
#[test]
fn kernel_abi_in_source() {
    let flat = emu::shipped_source("kernels/affine_grouped.cu");
    emu::assert_params(
        "affine_grouped.h",
        "AffineGroupedParams",
        &[
            "rows",
            "cols",
            "bits",
            "group_size",
            "experts",
            "pairs",
            "tiles",
            "tile_pairs",
            "slice_steps",
        ],
    );
    assert!(flat.contains("#include \"params/affine_grouped.h\""));
    assert!(
        flat.contains(
            "const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, const uint32_t* tiles, XT* y, \\ const AffineGroupedParams p)"
        ),
        "the entry points take (packed, scales, biases, x, tiles, y, AffineGroupedParams p), as affine_grouped/cuda.rs pushes them"
    );
    assert!(
        flat.contains(
            "const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, const uint32_t* tiles, \\ float* partial, const AffineGroupedParams p)"
        ),
        "the split entry points take (packed, scales, biases, x, tiles, partial, p), as affine_grouped/cuda.rs pushes them"
    );
    assert!(
        flat.contains("affine_split_sum_##XN(const float* partial, XT* y, const uint32_t n, const uint32_t slices)"),
        "the sum takes (partial, y, n, slices), as affine_grouped/cuda.rs pushes them"
    );
    assert!(flat.contains("constexpr int kSumThreads = 256;"));
    assert_eq!(gdn_ops::ops::affine_grouped::slicing::TARGET_BLOCKS, 264);
    for (xn, xt) in [
        ("f32", "float"),
        ("f16", "__half"),
        ("bf16", "__nv_bfloat16"),
    ] {
        let line = format!("AFFINE_GROUPED_FOR_SCALES({xn}, {xt})");
        assert!(flat.contains(&line), "missing `{line}`");
    }
}

/// The twin itself against a direct f64 sum over the dequantized weights (rounded into the
/// activation type as the twin rounds them), so that the kernel is compared with the products
/// the spec names.
#[test]
fn the_twin_is_the_spec() {
    let mut rng = Rng::xorshift(0x5EED_A6FF);
    let m = random_matrix(&mut rng, 4, 32, [3, 8, 64], DType::BF16);
    let counts = [2, 0, 3];
    let offsets = row_offsets(&counts);
    let x = rng.tensor_as(&[5, 64], -1.0, 1.0, DType::BF16);
    let twin = AffineTensor::upload(&m, &Device::Cpu).unwrap();
    let got = values(&twin.grouped_matmul_t(&x, &offsets).unwrap());
    let w = values(&twin.dequantize(None, 3 * 8, DType::BF16).unwrap());
    let xs = values(&x);
    let expert_of = |p: usize| (0..3).find(|&e| (offsets[e + 1] as usize) > p).unwrap();
    let mut want = vec![];
    for p in 0..5 {
        let e = expert_of(p);
        for r in 0..8 {
            let row = &w[(e * 8 + r) * 64..(e * 8 + r + 1) * 64];
            let dot: f64 = row
                .iter()
                .zip(&xs[p * 64..(p + 1) * 64])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            want.push(dot as f32);
        }
    }
    let want_t = Tensor::from_vec(want, (5, 8), &Device::Cpu).unwrap();
    let want = values(&want_t.to_dtype(DType::BF16).unwrap());
    assert_eq!(close("twin", &got, &want, Ty::Bf16, 1.0, 1e-6), None);
}
