//! The shipped Metal kernel `kernels/affine_grouped.metal` (the grouped quantized matmul of a
//! MoE prefill chunk, on simdgroup matrices), compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for all nine
//! `affine_grouped_qmm_{in}_{sc}` kernels with the tile schedule the host builds
//! (`gdn_ops::ops::affine_grouped::tiles`), and compared with a reference computed here from
//! [`gdn_ops::ops::affine::AffineMatrix`]: per expert, its rows dequantized (`dequantize_row`) and
//! rounded to the activation dtype, as the composed path does, then a matmul in f64 with that
//! expert's rows of x, over the op's cases (tests/common/affine_grouped.rs).
//!
//! Gate, per output value: within `(K + 2)·2⁻²⁴·Σₖ|w̃ₖ·xₖ|` (f32 accumulation of K products in
//! any order, each at most one rounding) plus one ulp of the activation dtype (the rounding of
//! y) of the exact `Σₖ w̃ₖ·xₖ`, w̃ the dequantized weight rounded to the activation dtype. The
//! harness is built with `-ffp-contract=off`, so the kernel's `s·q + b` is the reference's
//! multiply and add and w̃ is the same value (on a GPU the compiler may fuse it; with the f16
//! and bf16 scales of MLX checkpoints `s·q` is exact and nothing changes). Dropping one column
//! of 64 or reading another expert's rows fails it by orders of magnitude.
//!
//! The harness guards every buffer: a read past an input faults, and a row of y left
//! unwritten (a tile the schedule or the kernel dropped) fails the case.
//!
//! The split-K entries (`affine_grouped_split_*` over column slices into a float workspace,
//! every plane of which must be written, then the fixed-order sum `affine_split_sum_*`) run
//! the split-K cases the CUDA body's emulation runs (tests/common/affine_grouped.rs, the same
//! cuts), against the same reference and against the CPU twin
//! (`AffineTensor::split_matmul_t` on the CPU), as tests/affine_grouped_cuda_emulation.rs
//! gates the CUDA body.

mod common;
mod emu;

use candle_core::Device;
use common::affine_grouped::{
    cases as op_cases, inputs, seed, split_cases, Case as OpCase, EMULATION_MAX_WORK,
};
use common::{close, values, Input, Ty, TYPES};
use gdn_ops::ops::affine::{AffineMatrix, AffineTensor};
use gdn_ops::ops::affine_grouped::check_offsets;
use gdn_ops::ops::affine_grouped::tiles::{
    tile_schedule, AffineGroupedParams, AffineSplitSumParams, GroupedTile, GROUPED_SCRATCH_BYTES,
    GROUPED_THREADS, GROUPED_TILE_COLS, GROUPED_TILE_ROWS, SPLIT_SUM_THREADS,
};
use gdn_ops::ops::affine_grouped::TILE_COLS;

static HARNESS: emu::Harness =
    emu::Harness::metal_with("affine_grouped_harness", &["-ffp-contract=off"]);

struct Case {
    vt: Ty,
    st: Ty,
    m: AffineMatrix,
    /// `[P, cols]`, rounded to `vt`.
    x: Vec<f32>,
    offsets: Vec<u32>,
    /// Split-K: columns a slice (the split entries and the sum); 0: the one-pass entry.
    slice_cols: usize,
    label: String,
}

/// Case `i` of the op's cases.
fn case(i: usize, c: &OpCase) -> Case {
    sliced_case(i, c, 0)
}

/// Case `i`'s inputs (`seed(i)`) on the split entries with slices of `slice_cols` (0: the
/// one-pass entry).
fn sliced_case(i: usize, c: &OpCase, slice_cols: usize) -> Case {
    let x = inputs(c, seed(i));
    let entry = match slice_cols {
        0 => "affine_grouped_qmm".to_string(),
        n => format!("affine_grouped_split ({n} columns a slice)"),
    };
    Case {
        vt: c.x,
        st: c.scales,
        m: x.m,
        x: x.x,
        offsets: x.offsets,
        slice_cols,
        label: format!("{entry} {}_{} {}", c.x.name(), c.scales.name(), c.label()),
    }
}

fn run_harness(c: &Case) -> Result<Vec<f32>, String> {
    let m = &c.m;
    let p = *c.offsets.last().unwrap() as usize;
    check_offsets(&c.offsets, m.experts, p).map_err(|e| e.to_string())?;
    let tiles = tile_schedule(&c.offsets);
    let mut input = Input::new(b"AGQEMU02");
    for h in [
        c.vt.code(),
        c.st.code(),
        m.experts as u32,
        m.rows as u32,
        m.cols as u32,
        m.bits as u32,
        m.group_size as u32,
        p as u32,
        tiles.len() as u32,
        c.slice_cols as u32,
    ] {
        input.u32(h);
    }
    for &w in m.packed() {
        input.u32(w);
    }
    input.f32s(&m.scales().to_f32_vec());
    input.f32s(&m.biases().to_f32_vec());
    input.f32s(&c.x);
    for t in &tiles {
        input.u32(t.expert).u32(t.row_begin).u32(t.row_end);
    }
    let y = HARNESS.run(&input.0)?;
    if y.len() != p * m.rows {
        return Err(format!(
            "harness wrote {} values, expected {}",
            y.len(),
            p * m.rows
        ));
    }
    Ok(y)
}

/// The reference (per expert: dequantize, round to the activation dtype, multiply) and the
/// gate; returns what is wrong, if anything.
fn check(c: &Case, y: &[f32]) -> Option<String> {
    let m = &c.m;
    let (k, r) = (m.cols, m.rows);
    let gamma = (k + 2) as f64 * 2f64.powi(-24) * 1.001;
    let mut w = vec![0f32; k];
    let (mut worst, mut report) = (0f64, None);
    for e in 0..m.experts {
        let rows = c.offsets[e] as usize..c.offsets[e + 1] as usize;
        for n in 0..r {
            m.dequantize_row(e * r + n, &mut w);
            let w: Vec<f32> = w.iter().map(|&v| c.vt.round(v)).collect();
            for p in rows.clone() {
                let x = &c.x[p * k..][..k];
                let (mut want, mut magnitude) = (0f64, 0f64);
                for j in 0..k {
                    let t = w[j] as f64 * x[j] as f64;
                    want += t;
                    magnitude += t.abs();
                }
                let got = y[p * r + n] as f64;
                let allowed = gamma * magnitude + c.vt.ulp(got.abs().max(want.abs()) as f32) as f64;
                let excess = if got.is_finite() {
                    (got - want).abs() / allowed
                } else {
                    f64::INFINITY
                };
                if excess > worst {
                    worst = excess;
                    report = Some(format!(
                        "y[{p}, {n}] (expert {e}) = {got:e} vs {want:e}: {excess:.3e}x the allowed {allowed:.3e}"
                    ));
                }
            }
        }
    }
    if worst > 1.0 {
        report
    } else {
        None
    }
}

/// The op's cases (tests/common/affine_grouped.rs) the emulator runs in time
/// ([`EMULATION_MAX_WORK`]).
fn cases() -> Vec<Case> {
    op_cases()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.work() <= EMULATION_MAX_WORK)
        .map(|(i, c)| case(i, c))
        .collect()
}

#[test]
fn shipped_grouped_kernel_matches_the_per_expert_reference() {
    HARNESS.path();
    let jobs = cases();
    for &vt in &TYPES {
        for &st in &TYPES {
            assert!(jobs.iter().any(|c| (c.vt, c.st) == (vt, st)));
        }
    }
    let failures = common::failures(&jobs, |c| match run_harness(c) {
        Err(e) => Some(format!("[{}] {e}", c.label)),
        Ok(y) => check(c, &y).map(|bad| format!("[{}] {bad}", c.label)),
    });
    common::assert_no_failures(
        &failures,
        jobs.len(),
        "emulated launches disagree with the reference",
    );
}

/// The split-K entries and their sum on the split-K cases the CUDA body's emulation runs, at
/// the same cuts: within the reference's gate ([`check`]) and within 1 ulp of the activation
/// type at the CPU twin's value plus 1e-5 of max |y| (the CUDA body's gate: both round the
/// same weights once and sum in f32, in other orders).
#[test]
fn split_k_matches_the_cpu_twin() {
    HARNESS.path();
    let jobs: Vec<(Case, Vec<f32>)> = split_cases()
        .into_iter()
        .map(|s| {
            let c = sliced_case(s.index, &s.op, s.slice_steps * TILE_COLS);
            let twin = AffineTensor::upload(&c.m, &Device::Cpu).unwrap();
            let x = inputs(&s.op, seed(s.index)).x_tensor(&s.op);
            let want = values(&twin.split_matmul_t(&x).unwrap());
            (c, want)
        })
        .collect();
    assert!(jobs
        .iter()
        .any(|(c, _)| c.m.cols.div_ceil(c.slice_cols) > 2));
    let failures = common::failures(&jobs, |(c, want)| match run_harness(c) {
        Err(e) => Some(format!("[{}] {e}", c.label)),
        Ok(y) => check(c, &y)
            .or_else(|| close(&c.label, &y, want, c.vt, 1.0, 1e-5))
            .map(|bad| format!("[{}] {bad}", c.label)),
    });
    common::assert_no_failures(&failures, jobs.len(), "split-K launches disagree");
}

/// What the C++ build cannot see: the buffer indices (attributes, ignored by clang), the
/// parameter structs the Rust side mirrors, and the host's launch constants.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "affine_grouped_metal.h",
        "AffineGroupedParams",
        &[
            "experts",
            "rows",
            "cols",
            "bits",
            "group_size",
            "x_rows",
            "tiles",
            "slice_cols",
        ],
    );
    assert_eq!(std::mem::size_of::<AffineGroupedParams>(), 8 * 4);
    emu::assert_params(
        "affine_grouped_metal.h",
        "AffineSplitSumParams",
        &["n", "slices"],
    );
    assert_eq!(std::mem::size_of::<AffineSplitSumParams>(), 2 * 4);
    emu::assert_params(
        "affine_grouped_metal.h",
        "GroupedTile",
        &["expert", "row_begin", "row_end"],
    );
    assert_eq!(std::mem::size_of::<GroupedTile>(), 3 * 4);
    let flat =
        emu::shipped_source_including("kernels/affine_grouped.metal", "affine_grouped_metal.h");
    emu::assert_buffers(
        &flat,
        "#define AFFINE_GROUPED_QMM(",
        &["w", "scales", "biases", "x", "tiles", "y", "p"],
    );
    emu::assert_buffers(
        &flat,
        "#define AFFINE_GROUPED_SPLIT(",
        &["w", "scales", "biases", "x", "tiles", "partial", "p"],
    );
    emu::assert_buffers(&flat, "#define AFFINE_SPLIT_SUM(", &["partial", "y", "p"]);
    assert!(flat.contains("threadgroup float* scratch [[threadgroup(0)]]"));
    for (name, value) in [
        ("kTileM", GROUPED_TILE_ROWS),
        ("kTileN", GROUPED_TILE_COLS),
        ("kThreads", GROUPED_THREADS),
        ("kSumThreads", SPLIT_SUM_THREADS),
    ] {
        let decl = format!("{name} = {value},");
        assert!(flat.contains(&decl), "kernel lacks `{decl}`");
    }
    let harness = emu::shipped_source("kernels/emu/affine_grouped_harness.cpp");
    assert!(
        harness.contains(&format!("kHostScratchBytes = {GROUPED_SCRATCH_BYTES};")),
        "the harness's scratch size differs from GROUPED_SCRATCH_BYTES"
    );
    for vt in TYPES {
        for st in TYPES {
            let line = format!(
                "AFFINE_GROUPED_QMM(affine_grouped_qmm_{}_{}, {}, {})",
                vt.name(),
                st.name(),
                vt.msl(),
                st.msl()
            );
            assert!(flat.contains(&line), "missing `{line}`");
            let split = format!(
                "AFFINE_GROUPED_SPLIT(affine_grouped_split_{}_{}, {}, {})",
                vt.name(),
                st.name(),
                vt.msl(),
                st.msl()
            );
            assert!(flat.contains(&split), "missing `{split}`");
        }
        let sum = format!(
            "AFFINE_SPLIT_SUM(affine_split_sum_{}, {})",
            vt.name(),
            vt.msl()
        );
        assert!(flat.contains(&sum), "missing `{sum}`");
    }
}
