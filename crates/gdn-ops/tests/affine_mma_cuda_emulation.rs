//! The body of the tensor-core decode products, `kernels/affine_mma.cu`'s `affine_mma::body`
//! (the `affine_mma_{products,swiglu}_b4_bf16_<s>` entry points: one `mma.sync` m16n8k16 per 16
//! rows × 16 columns, a cp.async ring per warp, W warps splitting the columns), compiled as C++
//! with clang-19 on top of the Metal emulation plus the CUDA stand-ins (`kernels/emu/cuda/`),
//! run on the CPU with the host's geometry (grid (blocks_x, out_rows), 32·W threads, the
//! host's shared-memory formula) by `kernels/emu/affine_mma_cuda_harness.cpp`, and compared
//! with the CPU twin ([`AffineTensor::matmul_t`], [`AffineTensor::gather_matmul_t`],
//! [`AffineTensor::gather_swiglu`] on the CPU). The mma runs through the kernel's own emulation
//! path (fragments gathered with shuffles, summed in k order); the cp.async copies are
//! deferred to the thread's wait and their destinations hold 0xFF bytes until then, so a ring
//! stage read early or overwritten while still needed gives wrong weights or NaN scales. What
//! it cannot check is the GPU itself (the tensor cores' own summation, timing):
//! scripts/gpu/affine_mma_cuda.py and the CUDA device test do, on an H200.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`, like the other emulation tests; it
//! never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gate: every element within 1 ulp of bf16 at the twin's value plus 1e-5 of max |y| (the
//! allowance of the other affine kernels' gate; see [`ULPS`] and [`REL`] for why it holds
//! here; on these cases the outputs are in fact the twin's bits), every element written (the
//! harness fails on an unwritten one), NaN exactly where an expert id is out of range, and the
//! same bits from a second run with another blocks_x (the sums of a tile do not depend on
//! which block takes it). 26 cases at the shipped 2 super-steps a stage and 9 at 4, two runs
//! each: ~40 s on two cores (the emulated warps are fibers).
//!
//! Deliberate breaks, each confirmed to fail this test and reverted (kernels/affine_mma.cu):
//! (a) the B column selection `& 7u` -> `& 3u` in `body`: 19 of 25 and 7 of 9 cases fail
//! (those with more than 4 groups; values off by up to 1e3);
//! (b) `fmaf(-128.f, sum_x, cm[u])` -> `cm[u]` (the pairs' offset kept): every case fails;
//! (c) the ring reuse: `issue(n + kStages)` moved before stage n's registers are read: 18 of
//! 25 and 2 of 9 fail (every warp with more than kStages items: the stage holds the deferred
//! copy's 0xFF bytes, weights of 15 and NaN scales).
//! And the kernel as first written, which summed `c[2]`, `c[3]` past the `c[kBatch][4]`
//! accumulators at kBatch 2, does not compile here (-Warray-bounds, -Werror).

mod common;
mod emu;

use candle_core::Device;
use common::affine::{self, Case as OpCase, Gather, Kind};
use common::{close, failures, values, Input, Ty};
use gdn_ops::ops::affine::AffineTensor;
use std::time::Instant;

static HARNESS: emu::Harness = emu::Harness::cuda("affine_mma_cuda_harness");
/// The same body with 4 super-steps a ring stage (`AFFINE_MMA_BATCH`, the GPU harness's
/// default) instead of the shipped 2.
static HARNESS_BATCH4: emu::Harness =
    emu::Harness::cuda_with("affine_mma_cuda_harness", &["-DAFFINE_MMA_BATCH=4"]);

/// Allowed error in ulps of bf16 at the twin's value: both sides round their f32 sum to bf16
/// once, so two sums a hair apart may round to neighbours.
const ULPS: f32 = 1.0;
/// Allowed error as a fraction of max |y|: the kernel sums (128 + q)·x per group on the
/// tensor cores and takes 128·sum(x) out afterwards (one rounding of a value up to ~143×
/// larger than the group's sum), the twin sums q·x; the f32 difference is far below this.
const REL: f32 = 1e-5;

/// How many blocks share a row's tiles.
#[derive(Clone, Copy, Debug)]
enum Blocks {
    One,
    Two,
    /// One block a tile (the host's choice when the tiles fill the GPU).
    AllTiles,
}

struct Case {
    op: OpCase,
    /// Warps a block (W: they split the columns).
    warps: usize,
    blocks: Blocks,
    /// Sends no ids (a dense launch) for a one-expert, one-slot gathered case: the twin's
    /// SwiGLU takes ids only.
    dense_launch: bool,
    /// An output row whose expert id is out of range (its outputs must be NaN).
    bad_id: Option<usize>,
    seed: u64,
}

impl Case {
    fn tiles(&self) -> usize {
        let per_tile = if self.op.kind == Kind::Swiglu { 8 } else { 16 };
        self.op.outputs().div_ceil(per_tile)
    }
    fn blocks_x(&self, blocks: Blocks) -> usize {
        match blocks {
            Blocks::One => 1,
            Blocks::Two => 2,
            Blocks::AllTiles => self.tiles(),
        }
    }
    fn has_ids(&self) -> bool {
        self.op.gather != Gather::Dense && !self.dense_launch
    }
    fn label(&self) -> String {
        format!(
            "{} W {} blocks {:?} ({} tiles){}",
            self.op.label(),
            self.warps,
            self.blocks,
            self.tiles(),
            if self.dense_launch { " sent dense" } else { "" }
        )
    }
}

/// The harness input of `case` at `blocks_x` blocks: the shape, the launch, the matrix, x and
/// (when sent) the expert ids.
fn encode(case: &Case, blocks_x: usize, x_in: &affine::Inputs, sent_ids: &[u32]) -> Vec<u8> {
    let c = &case.op;
    let mut input = Input::new(b"AMMACUD1");
    for v in [
        c.experts,
        c.rows,
        c.cols,
        c.bits,
        c.group,
        c.out_rows(),
        c.x_div(),
        case.has_ids() as usize,
        (c.kind == Kind::Swiglu) as usize,
        case.warps,
        blocks_x,
    ] {
        input.u32(v as u32);
    }
    affine::send_matrix(&mut input, (c.x, c.scales), &x_in.m);
    input.f32s(&x_in.x);
    if case.has_ids() {
        sent_ids.iter().for_each(|&i| {
            input.u32(i);
        });
    }
    input.0
}

/// Runs the kernel's body on one case, twice (its blocks_x and another); `None` when it
/// matches the twin and the two runs give the same bits.
fn check(case: &Case, harness: &emu::Harness) -> Option<String> {
    let c = &case.op;
    let started = Instant::now();
    let what = case.label();
    let x_in = affine::inputs(c, case.seed);
    let twin = AffineTensor::upload(&x_in.m, &Device::Cpu).unwrap();
    let mut want = values(&x_in.run(c, &twin, &Device::Cpu));
    let mut sent_ids = x_in.ids.clone();
    if let Some(bad) = case.bad_id {
        sent_ids[bad] = (c.experts + 3) as u32;
    }
    let other = match case.blocks {
        Blocks::AllTiles => Blocks::One,
        _ => Blocks::AllTiles,
    };
    let run = |blocks| harness.run(&encode(case, case.blocks_x(blocks), &x_in, &sent_ids));
    let (mut got, again) = match (run(case.blocks), run(other)) {
        (Ok(g), Ok(a)) => (g, a),
        (Err(e), _) | (_, Err(e)) => return Some(format!("{what}: {e}")),
    };
    if let Some(i) = got
        .iter()
        .zip(&again)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        return Some(format!(
            "{what}: [{i}] = {} at blocks {:?} but {} at {other:?}",
            got[i], case.blocks, again[i]
        ));
    }
    if let Some(bad) = case.bad_id {
        // The rest must match the twin: the row is dropped on both sides.
        if let Some(failure) = affine::drop_nan_row(&what, bad, c.outputs(), &mut got, &mut want) {
            return Some(failure);
        }
    }
    let result = close(&what, &got, &want, Ty::Bf16, ULPS, REL);
    if result.is_none() {
        eprintln!("{what}: ok in {:.2}s", started.elapsed().as_secs_f32());
    }
    result
}

/// The cases: every column count of the list with both group sizes where the group count is
/// even (the host's condition), products and SwiGLU each, row counts below 16 and not
/// multiples of 16, the three scale types, 1, 2, 3, 4 and 8 warps (more warps than macro steps
/// at the short rows: idle warps), 1, 2 and all-tiles blocks; then dense and gathered launches
/// (x_div 1, 2 and 3), out-of-range expert ids and 16 warps.
fn cases() -> Vec<Case> {
    const COLS: [usize; 6] = [128, 256, 640, 2048, 2560, 6144];
    const SCALES: [Ty; 3] = [Ty::F32, Ty::F16, Ty::Bf16];
    const WARPS: [usize; 5] = [1, 2, 3, 4, 8];
    const BLOCKS: [Blocks; 3] = [Blocks::One, Blocks::Two, Blocks::AllTiles];
    let mut cases = vec![];
    let mut seed = 0x5EED_33A0;
    let mut n = 0;
    let mut push = |kind, group, shape: [usize; 3], tokens, gather, dense_launch, bad_id| {
        seed += 1;
        let op = OpCase::new(
            kind,
            (Ty::Bf16, SCALES[n % 3]),
            (4, group),
            shape,
            tokens,
            gather,
        );
        cases.push(Case {
            op,
            warps: WARPS[n % 5],
            blocks: BLOCKS[(n / 3) % 3],
            dense_launch,
            bad_id,
            seed,
        });
        n += 1;
    };
    let (slot, tok3) = (Gather::PerToken { slots: 1 }, Gather::PerToken { slots: 3 });
    for cols in COLS {
        for group in [64, 128] {
            if (cols / group) % 2 != 0 {
                continue;
            }
            // Fewer rows at the long rows: the emulated warps are slow.
            let rows = if cols >= 2048 { 21 } else { 37 };
            push(
                Kind::Products,
                group,
                [1, rows, cols],
                2,
                Gather::Dense,
                false,
                None,
            );
            push(
                Kind::Swiglu,
                group,
                [3, 2 * (rows / 2 + 3), cols],
                1,
                tok3,
                false,
                None,
            );
        }
    }
    // Fewer rows than a tile; a dense SwiGLU launch; a row of x per slot (x_div 1, gathered).
    push(
        Kind::Products,
        64,
        [1, 5, 512],
        1,
        Gather::Dense,
        false,
        None,
    );
    push(Kind::Swiglu, 128, [1, 14, 1024], 2, slot, true, None);
    let per_slot = Gather::PerSlot { slots: 2 };
    push(Kind::Products, 64, [3, 40, 768], 2, per_slot, false, None);
    // Out-of-range expert ids: NaN in their rows only.
    push(Kind::Products, 128, [3, 24, 2048], 1, tok3, false, Some(1));
    push(
        Kind::Swiglu,
        64,
        [4, 20, 1280],
        2,
        Gather::PerToken { slots: 2 },
        false,
        Some(2),
    );
    // The most warps a block (kMaxWarps), more than the 12 macro steps of the row.
    push(
        Kind::Products,
        64,
        [1, 9, 6144],
        1,
        Gather::Dense,
        false,
        None,
    );
    cases.last_mut().unwrap().warps = 16;
    cases
}

#[test]
fn shipped_mma_kernel_matches_the_cpu_twin() {
    let cases = cases();
    let started = Instant::now();
    let failed = failures(&cases, |c| check(c, &HARNESS));
    eprintln!(
        "{} cases in {:.1}s",
        cases.len(),
        started.elapsed().as_secs_f32()
    );
    common::assert_no_failures(&failed, cases.len(), "cases fail");
}

/// Every third case with 4 super-steps a stage: the batch the GPU harness checked, and the
/// one whose pairwise sum of the super-steps' accumulators has two levels.
#[test]
fn mma_kernel_with_four_super_steps_a_stage_matches_the_cpu_twin() {
    let cases: Vec<Case> = cases().into_iter().step_by(3).collect();
    let failed = failures(&cases, |c| check(c, &HARNESS_BATCH4));
    common::assert_no_failures(&failed, cases.len(), "cases fail");
}

/// The parameter struct the harness fills in field order.
#[test]
fn params_match_the_host() {
    let fields: Vec<String> = emu::params_fields("affine.h", "AffineParams")
        .into_iter()
        .map(|(_, name)| name)
        .collect();
    assert_eq!(
        fields,
        affine::AFFINE_PARAMS,
        "the harness builds AffineParams positionally"
    );
}
