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
//! every element written (the harness fails on an unwritten one).

mod common;
mod emu;

use candle_core::{DType, Device, Tensor};
use common::{close, failures, random_matrix, values, Input, Rng, Ty};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::affine_grouped::{
    tile_pairs_for, tile_schedule, SMEM_BYTES, SPAN_COLS, THREADS, TILE_COLS, TILE_PAIRS,
    TILE_PAIRS_CHOICES, TILE_ROWS,
};

static HARNESS: emu::Harness = emu::Harness::cuda("affine_grouped_cuda_harness");

struct Case {
    x: Ty,
    scales: Ty,
    bits: usize,
    group: usize,
    rows: usize,
    cols: usize,
    /// Rows of x per expert (0 for an expert without pairs).
    counts: Vec<usize>,
    /// The tile height, or `None` for the host's choice.
    tile_pairs: Option<usize>,
    seed: u64,
}

/// Runs the kernel's body on one case; `None` when it matches the twin.
fn check(c: &Case) -> Option<String> {
    let mut rng = Rng::xorshift(c.seed);
    let experts = c.counts.len();
    let m = random_matrix(
        &mut rng,
        c.bits,
        c.group,
        [experts, c.rows, c.cols],
        c.scales.dtype(),
    );
    let offsets = common::row_offsets(&c.counts);
    let pairs = *offsets.last().unwrap() as usize;
    let x = rng.tensor_as(&[pairs, c.cols], -1.0, 1.0, c.x.dtype());
    let twin = AffineTensor::upload(&m, &Device::Cpu).unwrap();
    let want = values(&twin.grouped_matmul_t(&x, &offsets).unwrap());
    let tile_pairs = c.tile_pairs.unwrap_or_else(|| tile_pairs_for(&offsets));
    let schedule = tile_schedule(&offsets, tile_pairs);
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
    ] {
        input.u32(v as u32);
    }
    input.u32(c.x.code()).u32(c.scales.code());
    m.packed().iter().for_each(|&w| {
        input.u32(w);
    });
    input
        .f32s(&values(&twin.scales))
        .f32s(&values(&twin.biases));
    input.f32s(&values(&x));
    schedule.iter().for_each(|&t| {
        input.u32(t);
    });
    let what = format!(
        "x {} scales {} {}-bit g{} rows {} cols {} tiles of {tile_pairs}, counts {:?}",
        c.x.name(),
        c.scales.name(),
        c.bits,
        c.group,
        c.rows,
        c.cols,
        c.counts
    );
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

fn cases() -> Vec<Case> {
    let mut cases = vec![];
    let mut seed = 0x5EED_A600;
    let mut case = |x, scales, bits, group, rows, cols, counts: &[usize], tile_pairs| {
        seed += 1;
        cases.push(Case {
            x,
            scales,
            bits,
            group,
            rows,
            cols,
            counts: counts.to_vec(),
            tile_pairs,
            seed,
        });
    };
    // Every instantiation at every tile height: experts without pairs (first and last), one
    // pair, a count that crosses a tile (70 = 64 + 6), rows that are not a multiple of the
    // block's 128.
    for x in [Ty::F32, Ty::F16, Ty::Bf16] {
        for scales in [Ty::F32, Ty::F16, Ty::Bf16] {
            for tile_pairs in TILE_PAIRS_CHOICES {
                let counts = [0, 1, 70, 3, 0];
                case(x, scales, 4, 64, 96, 128, &counts, Some(tile_pairs));
            }
        }
    }
    // Two row blocks, the second partial (200 = 128 + 72), and a last step of 32 columns
    // (96 = 64 + 32); counts that leave whole 16-pair fragments of a tile empty (40 of 64, 17 of
    // 32 or 64), at every tile height.
    for (x, scales) in [(Ty::Bf16, Ty::Bf16), (Ty::F16, Ty::F32), (Ty::F32, Ty::F16)] {
        for tile_pairs in TILE_PAIRS_CHOICES {
            let counts = [40, 17, 0, 2];
            case(x, scales, 4, 32, 200, 96, &counts, Some(tile_pairs));
        }
    }
    let mut case = |x, scales, bits, group, rows, cols, counts: &[usize]| {
        case(x, scales, bits, group, rows, cols, counts, None)
    };
    // The other widths and group sizes.
    case(Ty::Bf16, Ty::Bf16, 8, 32, 64, 96, &[5, 0, 64, 2]);
    case(Ty::Bf16, Ty::F32, 2, 128, 32, 256, &[17, 1]);
    case(Ty::F32, Ty::Bf16, 8, 128, 80, 128, &[2, 129]);
    // Many steps (7 and 16), 8 and 2 bits, 2-bit rows of 24 bytes.
    case(Ty::F16, Ty::F16, 8, 64, 136, 448, &[20, 3, 33]);
    case(Ty::Bf16, Ty::Bf16, 2, 64, 72, 1024, &[9, 2]);
    case(Ty::Bf16, Ty::F16, 2, 32, 64, 96, &[5, 3]);
    // Model widths: Qwen3-Next's down projection (cols 512) and gate/up input (cols 2048),
    // 4-bit, group 64, bf16, on one or two row blocks.
    case(Ty::Bf16, Ty::Bf16, 4, 64, 128, 512, &[64, 0, 65, 1]);
    case(Ty::Bf16, Ty::Bf16, 4, 64, 64, 2048, &[3, 40]);
    cases
}

#[test]
fn shipped_kernel_matches_the_cpu_twin() {
    let cases = cases();
    let failed = failures(&cases, check);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
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
        ],
    );
    assert!(flat.contains("#include \"params/affine_grouped.h\""));
    assert!(
        flat.contains(
            "const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, const uint32_t* tiles, XT* y, \\ const AffineGroupedParams p)"
        ),
        "the entry points take (packed, scales, biases, x, tiles, y, AffineGroupedParams p), as affine_grouped/cuda.rs pushes them"
    );
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
    let offsets = common::row_offsets(&counts);
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
