//! The body of the shipped wide decode products, `kernels/affine.cu`'s `affine_wide::wide_body`
//! (the `affine_wide_{products,swiglu}_b<bits>_r<rows>_*` entry points: 16-byte chunks per
//! lane, `lpr` lanes per row, several rows per row group), compiled as C++ with clang-19 on top
//! of the Metal emulation plus the CUDA stand-ins (`kernels/emu/cuda/`), run on the CPU with the
//! host's own geometry (`gdn_ops::ops::affine::wide`) by
//! `kernels/emu/affine_wide_cuda_harness.cpp`, and compared with the CPU twin
//! ([`AffineTensor::gather_matmul_t`], [`AffineTensor::gather_swiglu`],
//! [`AffineTensor::matmul_t`] on the CPU). What it cannot check is the GPU itself (timing,
//! the real shuffles): `tests/cuda_kernels.rs` and `tests/cuda_moe.rs` do, on the H100.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`, like the other emulation tests; it
//! never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gate: every element within 1 ulp of the activation type at the twin's value plus 1e-5 of
//! max |y| (both sides round the same weights once and sum in f32, in different orders), every
//! element written (the harness fails on an unwritten one), and NaN exactly where an expert id
//! is out of range. The cases: the family's (tests/common/affine.rs) that the wide kernels
//! cover, and launch geometries of the emulation's own.

mod common;
mod emu;

use candle_core::Device;
use common::affine::{self, Case as OpCase, Gather, Kind};
use common::{close, failures, values, Input, Ty};
use gdn_ops::ops::affine::{split, stream, wide, AffineTensor};

static HARNESS: emu::Harness = emu::Harness::cuda("affine_wide_cuda_harness");

/// A case of the family's (tests/common/affine.rs) with the emulation's own launch geometry.
struct Case {
    op: OpCase,
    /// Its index in the family's cases, for the inputs' seed; `None` for the emulation's own.
    index: Option<usize>,
    /// Rows per row group, or `None` for the host's choice (at 132 SMs).
    rows_per_group: Option<usize>,
    /// An output row whose expert id is out of range (its outputs must be NaN).
    bad_id: Option<usize>,
    seed: u64,
}

/// Runs the kernel's body on one case; `None` when it matches the twin.
fn check(case: &Case) -> Option<String> {
    let c = &case.op;
    let (x_in, sent_ids, want) = prepare(case, case.index.map_or(case.seed, affine::seed));
    let (outputs, swiglu) = (c.outputs(), c.kind == Kind::Swiglu);
    let lpr = wide::lanes_per_row(c.bits, c.cols);
    let rows_per_group = case
        .rows_per_group
        .unwrap_or_else(|| wide::rows_per_group(outputs, c.out_rows(), lpr, swiglu, 132));
    let blocks_x = wide::blocks_x(outputs, lpr, rows_per_group);
    let launch = [rows_per_group, lpr, blocks_x, 0, 1];
    let what = format!("{} rows/group {rows_per_group} lpr {lpr}", c.label());
    judge(
        &what,
        HARNESS.run(&encode(case, launch, &x_in, &sent_ids)),
        want,
        case,
    )
}

/// The inputs of `case` from `seed`, the expert ids sent (one out of range where the case
/// says), and the CPU twin's outputs.
fn prepare(case: &Case, seed: u64) -> (affine::Inputs, Vec<u32>, Vec<f32>) {
    let c = &case.op;
    let x_in = affine::inputs(c, seed);
    let twin = AffineTensor::upload(&x_in.m, &Device::Cpu).unwrap();
    let want = values(&x_in.run(c, &twin, &Device::Cpu));
    // A dense case sends no ids.
    let mut sent_ids = x_in.ids.clone();
    if let Some(bad) = case.bad_id {
        sent_ids[bad] = (c.experts + 3) as u32;
    }
    (x_in, sent_ids, want)
}

/// The harness's output `got` against the twin's `want`: NaN in the row of an out-of-range
/// expert id, the rest within 1 ulp + 1e-5 of max |y|; `None` when it matches.
fn judge(
    what: &str,
    got: Result<Vec<f32>, String>,
    mut want: Vec<f32>,
    case: &Case,
) -> Option<String> {
    let mut got = match got {
        Err(e) => return Some(format!("{what}: {e}")),
        Ok(got) => got,
    };
    if let Some(bad) = case.bad_id {
        // The rest must match the twin: the row is dropped on both sides.
        if let Some(failure) =
            affine::drop_nan_row(what, bad, case.op.outputs(), &mut got, &mut want)
        {
            return Some(failure);
        }
    }
    let result = close(what, &got, &want, case.op.x, 1.0, 1e-5);
    if result.is_none() {
        eprintln!("{what}: ok");
    }
    result
}

/// The harness input of `case`: the shape, then the launch (rows per group, lanes per row,
/// blocks along the outputs, the body: 0 wide, 1 streamed, 2 split, the streamed body's steps), then the weights, x
/// and (when gathered) the expert ids sent.
fn encode(case: &Case, launch: [usize; 5], x_in: &affine::Inputs, sent_ids: &[u32]) -> Vec<u8> {
    let c = &case.op;
    let has_ids = c.gather != Gather::Dense;
    let mut input = Input::new(b"AWDCUDA2");
    for v in [
        c.experts,
        c.rows,
        c.cols,
        c.bits,
        c.group,
        c.out_rows(),
        c.x_div(),
        has_ids as usize,
        (c.kind == Kind::Swiglu) as usize,
    ]
    .into_iter()
    .chain(launch)
    {
        input.u32(v as u32);
    }
    affine::send_matrix(&mut input, (c.x, c.scales), &x_in.m);
    input.f32s(&x_in.x);
    if has_ids {
        sent_ids.iter().for_each(|&i| {
            input.u32(i);
        });
    }
    input.0
}

/// Runs the streamed body (kernels/affine_stream.cu) and the wide body on one case at the same
/// rows per group; `None` when the two outputs are the same bits. The streamed launch is the
/// host's (`stream::launch`) for the family's cases, and 1 to 3 blocks for the emulation's own,
/// so that every warp walks several row groups with the next one's loads in flight.
fn check_stream(case: &Case, which: usize) -> Option<String> {
    let c = &case.op;
    let seed = case.index.map_or(case.seed, affine::seed);
    let x_in = affine::inputs(c, seed);
    let mut sent_ids = x_in.ids.clone();
    if let Some(bad) = case.bad_id {
        sent_ids[bad] = (c.experts + 3) as u32;
    }
    let swiglu = c.kind == Kind::Swiglu;
    let outputs = c.outputs();
    let lpr = wide::lanes_per_row(c.bits, c.cols);
    let host = stream::launch(c.bits, c.cols, outputs, c.out_rows(), swiglu, 132);
    let (rows, blocks_x) = match case.rows_per_group {
        None => (host.rows, host.blocks_x),
        // Instantiated: 1 or 2 rows a group for the products, 1 for the SwiGLU.
        Some(r) => (if swiglu { 1 } else { r.min(2) }, 1 + which % 3),
    };
    let wide_launch = [rows, lpr, wide::blocks_x(outputs, lpr, rows), 0, 1];
    let stream_launch = [rows, lpr, blocks_x, 1, host.steps];
    let what = format!(
        "{} rows/group {rows} lpr {lpr} steps {} blocks {blocks_x}",
        c.label(),
        host.steps
    );
    let run = |launch| HARNESS.run(&encode(case, launch, &x_in, &sent_ids));
    let (wide_y, stream_y) = match (run(wide_launch), run(stream_launch)) {
        (Ok(w), Ok(s)) => (w, s),
        (Err(e), _) | (_, Err(e)) => return Some(format!("{what}: {e}")),
    };
    let differ = wide_y
        .iter()
        .zip(&stream_y)
        .position(|(w, s)| w.to_bits() != s.to_bits());
    match differ {
        Some(i) => Some(format!(
            "{what}: streamed [{i}] = {} against the wide kernel's {}",
            stream_y[i], wide_y[i]
        )),
        None => {
            eprintln!("{what}: same bits");
            None
        }
    }
}

#[test]
fn shipped_streamed_kernel_gives_the_wide_kernels_bits() {
    let cases: Vec<(usize, Case)> = cases()
        .into_iter()
        .filter(|c| stream::covers(c.op.bits, c.op.group, c.op.cols))
        .enumerate()
        .collect();
    let failed: Vec<String> = cases
        .iter()
        .filter_map(|(i, c)| check_stream(c, *i))
        .collect();
    common::assert_no_failures(&failed, cases.len(), "cases differ");
}

/// Runs the one-pass body (`affine_stream::rows_body`: T activation rows, each weight chunk
/// unpacked once) and the streamed one-row body (one block row per activation row, each row
/// alone) on a dense case of T = 2..8 rows; `None` when every row's outputs are the same bits.
/// The one-pass launch is the host's (`stream::pass_launch`) or 1 to 3 blocks, so that warps
/// walk several row groups.
fn check_pass(case: &Case, which: usize) -> Option<String> {
    let c = &case.op;
    let x_in = affine::inputs(c, case.seed);
    let outputs = c.outputs();
    let x_rows = c.out_rows();
    let lpr = wide::lanes_per_row(c.bits, c.cols);
    let alone = stream::launch(c.bits, c.cols, outputs, 1, false, 132);
    let host = stream::pass_launch(c.bits, c.cols, outputs, x_rows, 132);
    let blocks_x = if which.is_multiple_of(2) {
        host.blocks_x
    } else {
        1 + which % 3
    };
    let what = format!(
        "{} x rows {x_rows} lpr {lpr} steps {} blocks {blocks_x}",
        c.label(),
        host.steps
    );
    let run = |launch| HARNESS.run(&encode(case, launch, &x_in, &x_in.ids));
    let one_row = [alone.rows, lpr, alone.blocks_x, 1, alone.steps];
    let (alone_y, pass_y) = match (run(one_row), run([1, lpr, blocks_x, 3, host.steps])) {
        (Ok(a), Ok(p)) => (a, p),
        (Err(e), _) | (_, Err(e)) => return Some(format!("{what}: {e}")),
    };
    let differ = alone_y
        .iter()
        .zip(&pass_y)
        .position(|(a, p)| a.to_bits() != p.to_bits());
    match differ {
        Some(i) => Some(format!(
            "{what}: one pass [row {}, {}] = {} against {} alone",
            i / outputs,
            i % outputs,
            pass_y[i],
            alone_y[i]
        )),
        None => {
            eprintln!("{what}: same bits");
            None
        }
    }
}

#[test]
fn one_pass_over_several_rows_gives_each_row_its_bits_alone() {
    let mut cases = vec![];
    let mut seed = 0x5EED_B800;
    // Every row count, both widths, 8/16/32 lanes a row and 1, 2 and 4 steps (256, 512, 2048,
    // 4096 columns at 4 bits), a row count of a partial block, each (x, scales) type.
    let shapes = [
        (Ty::Bf16, Ty::Bf16, 4, 64, 36, 2048),
        (Ty::F32, Ty::Bf16, 4, 64, 20, 4096),
        (Ty::F16, Ty::F16, 4, 32, 40, 512),
        (Ty::F32, Ty::F32, 8, 32, 24, 256),
        (Ty::Bf16, Ty::F16, 8, 128, 12, 2048),
        (Ty::F16, Ty::F32, 4, 128, 70, 256),
        (Ty::Bf16, Ty::F32, 4, 64, 24, 1280),
    ];
    for (k, x_rows) in stream::PASS_ROWS.enumerate() {
        for (i, &(x, scales, bits, group, rows, cols)) in shapes.iter().enumerate() {
            // Every shape at 2, 5 and 8 rows; one shape a count between.
            if !matches!(x_rows, 2 | 5 | 8) && i != k % shapes.len() {
                continue;
            }
            seed += 1;
            let op = OpCase::new(
                Kind::Products,
                (x, scales),
                (bits, group),
                [1, rows, cols],
                x_rows,
                Gather::Dense,
            );
            cases.push(Case {
                op,
                index: None,
                rows_per_group: Some(1),
                bad_id: None,
                seed,
            });
        }
    }
    let failed: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(i, c)| check_pass(c, i))
        .collect();
    common::assert_no_failures(&failed, cases.len(), "cases differ");
}

/// Runs the block-split body (`affine_split::split_body`) on one case, `rows_per_group` rows a
/// block or the host's choice at 132 SMs; `None` when it matches the twin (the wide kernel's
/// gate: it sums the same chunks in another order).
fn check_split(case: &Case) -> Option<String> {
    let c = &case.op;
    let (x_in, sent_ids, want) = prepare(case, case.seed);
    let outputs = c.outputs();
    let rows = case
        .rows_per_group
        .unwrap_or_else(|| split::rows_per_block(outputs, c.out_rows(), 132));
    let launch = [rows, 32, split::blocks_x(outputs, rows), 2, 1];
    let what = format!("{} split, {rows} rows a block", c.label());
    judge(
        &what,
        HARNESS.run(&encode(case, launch, &x_in, &sent_ids)),
        want,
        case,
    )
}

/// The split body's cases: the merged hyper-connection product's row length (10 240 four-bit
/// columns, 320 chunks: lanes of one and of two chunks) at a few rows, both rows-a-block entry
/// points with a partial last block, 8 bits, rows shorter than the block's lanes (idle warps
/// add nothing), gathered rows and an out-of-range expert id.
fn split_cases() -> Vec<Case> {
    let mut seed = 0x5EED_5B17;
    let mut cases = vec![];
    let mut case = |(x, scales), (bits, group), shape, gather, rows_per_group, bad_id| {
        seed += 1;
        cases.push(Case {
            op: OpCase::new(Kind::Products, (x, scales), (bits, group), shape, 1, gather),
            index: None,
            rows_per_group,
            bad_id,
            seed,
        });
    };
    let (dense, tok) = (Gather::Dense, Gather::PerToken { slots: 2 });
    case(
        (Ty::Bf16, Ty::Bf16),
        (4, 64),
        [1, 5, 10240],
        dense,
        Some(2),
        None,
    );
    case(
        (Ty::F32, Ty::F16),
        (4, 32),
        [1, 3, 8192],
        dense,
        Some(1),
        None,
    );
    case(
        (Ty::F16, Ty::F32),
        (8, 64),
        [1, 5, 4096],
        dense,
        Some(2),
        None,
    );
    case(
        (Ty::Bf16, Ty::F32),
        (8, 128),
        [1, 3, 6144],
        dense,
        None,
        None,
    );
    case(
        (Ty::Bf16, Ty::Bf16),
        (4, 64),
        [1, 7, 2048],
        dense,
        Some(2),
        None,
    );
    case(
        (Ty::Bf16, Ty::Bf16),
        (4, 64),
        [3, 3, 4096],
        tok,
        Some(2),
        Some(1),
    );
    cases
}

#[test]
fn shipped_split_kernel_matches_the_cpu_twin() {
    let cases = split_cases();
    common::assert_no_failures(&failures(&cases, check_split), cases.len(), "cases fail");
}

#[test]
fn shipped_kernel_matches_the_cpu_twin() {
    let cases = cases();
    common::assert_no_failures(&failures(&cases, check), cases.len(), "cases fail");
}

/// The most work (`out_rows · rows · cols`) a family case may have here: the emulated warps
/// are fibers, a thousand times slower than the GPU.
const MAX_WORK: usize = 60_000;

/// The family's cases the wide kernels cover ([`wide::covers`]: 4 and 8 bits, rows of whole
/// 16-byte chunks) up to [`MAX_WORK`], with the host's geometry; then the emulation's own:
/// every rows-per-group entry point, and out-of-range expert ids.
fn cases() -> Vec<Case> {
    let mut cases = vec![];
    for (i, op) in affine::cases().into_iter().enumerate() {
        if wide::covers(op.bits, op.group, op.cols) && op.out_rows() * op.rows * op.cols <= MAX_WORK
        {
            cases.push(Case {
                op,
                index: Some(i),
                rows_per_group: None,
                bad_id: None,
                seed: 0,
            });
        }
    }
    let mut seed = 0x5EED_A700;
    let mut case = |x,
                    scales,
                    bits,
                    group,
                    shape: [usize; 3],
                    tokens,
                    gather,
                    swiglu,
                    rows_per_group,
                    bad_id| {
        seed += 1;
        let kind = if swiglu { Kind::Swiglu } else { Kind::Products };
        cases.push(Case {
            op: OpCase::new(kind, (x, scales), (bits, group), shape, tokens, gather),
            index: None,
            rows_per_group,
            bad_id,
            seed,
        });
    };
    let tok = Gather::PerToken { slots: 3 };
    // Every (x, scales) instantiation, both widths, both kinds, at 8 lanes a row (256 columns
    // of 4 bits), rows that do not fill a block, every rows-per-group entry point.
    for x in [Ty::F32, Ty::F16, Ty::Bf16] {
        for scales in [Ty::F32, Ty::F16, Ty::Bf16] {
            for r in [1, 2, 4] {
                case(x, scales, 4, 64, [3, 70, 256], 1, tok, false, Some(r), None);
            }
            for r in [1, 2] {
                case(x, scales, 8, 32, [3, 38, 256], 1, tok, true, Some(r), None);
            }
        }
    }
    // 16 and 32 lanes a row (512 and 2048 columns of 4 bits; 8 bits at 256 and 1024 columns),
    // every group size, a row count of a partial block, more chunks than lanes (4096).
    for (bits, group, cols) in [
        (4, 32, 512),
        (4, 128, 2048),
        (8, 64, 256),
        (8, 128, 1024),
        (4, 64, 4096),
    ] {
        case(
            Ty::Bf16,
            Ty::Bf16,
            bits,
            group,
            [2, 36, cols],
            1,
            tok,
            false,
            None,
            None,
        );
        case(
            Ty::Bf16,
            Ty::Bf16,
            bits,
            group,
            [2, 36, cols],
            1,
            tok,
            true,
            None,
            None,
        );
    }
    // Chunks not a multiple of the lanes (40 chunks of 32 lanes: lanes with 1 and 2 steps).
    case(
        Ty::F32,
        Ty::Bf16,
        4,
        64,
        [2, 24, 1280],
        2,
        tok,
        false,
        Some(4),
        None,
    );
    // Two tokens, a row of x per slot (the experts' down products), and a dense product.
    case(
        Ty::Bf16,
        Ty::Bf16,
        4,
        64,
        [4, 40, 512],
        2,
        Gather::PerSlot { slots: 3 },
        false,
        Some(2),
        None,
    );
    case(
        Ty::F16,
        Ty::F16,
        4,
        64,
        [1, 52, 2048],
        2,
        Gather::Dense,
        false,
        Some(4),
        None,
    );
    // 8 bits at 2048 and 4096 columns with f16 activations (large gate and up values).
    case(
        Ty::F16,
        Ty::F16,
        8,
        32,
        [2, 24, 2048],
        1,
        Gather::PerToken { slots: 1 },
        true,
        Some(1),
        None,
    );
    case(
        Ty::F16,
        Ty::F32,
        8,
        64,
        [2, 24, 4096],
        1,
        Gather::PerToken { slots: 1 },
        true,
        Some(2),
        None,
    );
    // An out-of-range expert id: NaN in its row only.
    case(
        Ty::Bf16,
        Ty::Bf16,
        4,
        64,
        [3, 20, 512],
        1,
        Gather::PerToken { slots: 4 },
        false,
        Some(1),
        Some(2),
    );
    case(
        Ty::Bf16,
        Ty::F32,
        8,
        64,
        [3, 20, 512],
        1,
        Gather::PerToken { slots: 4 },
        true,
        Some(2),
        Some(0),
    );
    cases
}

/// The kernel's warps per block, as the host mirrors it, and the parameter struct the harness
/// fills in field order.
#[test]
fn block_constant_and_params_match_the_host() {
    let flat = emu::shipped_source("kernels/affine.cu");
    for line in [
        format!("constexpr uint32_t kWideWarps = {};", wide::WARPS),
        format!("constexpr uint32_t kSplitWarps = {};", split::WARPS),
    ] {
        assert!(flat.contains(&line), "missing `{line}`");
    }
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
