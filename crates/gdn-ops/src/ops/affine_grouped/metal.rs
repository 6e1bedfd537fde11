//! Metal host side of `kernels/affine_grouped.metal`: the expert products of a prefill chunk,
//! rows sorted by expert, in one dispatch (MLX's `gather_qmm` with sorted indices), instead of
//! a dequantization, a matmul and a copy per expert in use; and the dense case's split-K
//! ([`split_matmul_t`], `super::split_k`): the same body over column slices into a float
//! workspace, then the fixed-order sum of the slices.
//!
//! The launch geometry here is what `kernels/emu/affine_grouped_harness.cpp` emulates; change
//! both together.

use super::check_offsets;
use super::slicing::slicing;
use super::tiles::{
    tile_schedule, AffineGroupedParams, AffineSplitSumParams, GROUPED_SCRATCH_BYTES,
    GROUPED_THREADS, GROUPED_TILE_COLS, SPLIT_SUM_THREADS,
};
use super::TILE_COLS;
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffers, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use crate::launches;
use crate::ops::affine::metal::weight_buffers;
use crate::ops::affine::AffineTensor;
use anyhow::{ensure, Result};
use candle_core::Tensor;

const OP: &str = "grouped expert matmul";

const SOURCE: KernelSource = metal_source!("affine_grouped.metal", "params/affine_grouped_metal.h");

/// Whether the kernel covers `a`'s format (the checks of [`grouped_matmul_t`] on the weights).
pub fn supports(a: &AffineTensor) -> bool {
    matches!(a.bits, 2 | 3 | 4 | 5 | 6 | 8)
        && a.group_size > 0
        && a.group_size.is_multiple_of(32)
        && a.cols.is_multiple_of(a.group_size)
}

/// `x` `[P, cols]`, rows sorted by expert (expert `e`'s rows are `offsets[e]..offsets[e + 1]`,
/// `offsets.len() == experts + 1`, `offsets[experts] == P`) → `[P, rows]` in x's dtype: row
/// `p` of expert `e` is `x[p] · W_eᵀ`, `W_e` dequantized into x's dtype, products summed in
/// f32. One launch, none for an empty result.
pub fn grouped_matmul_t(a: &AffineTensor, x: &Tensor, offsets: &[u32]) -> Result<Tensor> {
    let (x_rows, cols) = x
        .dims2()
        .map_err(|_| anyhow::anyhow!("{OP}: x must be [rows, {}], got {:?}", a.cols, x.dims()))?;
    ensure!(
        cols == a.cols,
        "{OP}: x {:?} does not end in {}",
        x.dims(),
        a.cols
    );
    ensure!(
        x.device().same_device(a.device()),
        "{OP}: x and the weights are on different devices"
    );
    check_offsets(offsets, a.experts, x_rows)?;
    ensure!(
        matches!(a.bits, 2 | 3 | 4 | 5 | 6 | 8),
        "{OP}: no kernel for {}-bit weights",
        a.bits
    );
    ensure!(
        a.group_size.is_multiple_of(32) && a.group_size > 0 && a.cols.is_multiple_of(a.group_size),
        "{OP}: group size {} with {} columns (the kernel needs a multiple of 32 that divides the columns)",
        a.group_size,
        a.cols
    );
    ensure!(
        [a.experts * a.rows, a.cols, x_rows]
            .iter()
            .all(|&n| u32::try_from(n).is_ok()),
        "{OP}: sizes beyond u32 ({} experts × {} rows, {} columns, {x_rows} rows of x)",
        a.experts,
        a.rows,
        a.cols
    );
    launch(a, x, offsets, None)
}

/// The split-K products of one matrix (`a.experts == 1`) and 2-D `x` of 1..=[`super::TILE_PAIRS`]
/// rows (what `AffineTensor::has_split_kernel` lets through): the grouped body over
/// [`slicing`]'s column slices (the CUDA kernel's cut) into a float workspace from candle's
/// buffer pool, then `affine_split_sum_*` adding the slices in order into y; one dispatch
/// writing y when one slice covers the matrix.
pub fn split_matmul_t(a: &AffineTensor, x: &Tensor) -> Result<Tensor> {
    let x_rows = x.dim(0)?;
    ensure!(
        a.experts == 1 && (1..=super::TILE_PAIRS).contains(&x_rows),
        "split-K matmul: {x_rows} rows of x on a stack of {} experts (one matrix, 1..={} rows)",
        a.experts,
        super::TILE_PAIRS
    );
    let (slice_steps, slices) = slicing(a.rows, a.cols);
    let split = (slices > 1).then_some((slice_steps * TILE_COLS, slices));
    launch(a, x, &[0, x_rows as u32], split)
}

/// One grouped dispatch, or with `split` = `(slice_cols, slices)` the split entry over
/// `slices` threadgroup planes and the sum.
fn launch(
    a: &AffineTensor,
    x: &Tensor,
    offsets: &[u32],
    split: Option<(usize, usize)>,
) -> Result<Tensor> {
    let x_rows = x.dim(0)?;
    let dtype = x.dtype();
    let entry = match split {
        Some(_) => "affine_grouped_split",
        None => "affine_grouped_qmm",
    };
    let name = kernel_instance(entry, &[dtype, a.scales.dtype()], OP)?;
    if x_rows == 0 || a.rows == 0 {
        // Nothing to compute: an empty result (candle's zero fill, a blit of no bytes).
        return launches::candle_op(Tensor::zeros((x_rows, a.rows), dtype, x.device()));
    }
    let tiles = tile_schedule(offsets);
    let dev = metal_device(&a.packed, OP)?;
    let gemm = pipeline(&dev, &SOURCE, &name)?;
    let sum = match split {
        Some(_) => Some(pipeline(
            &dev,
            &SOURCE,
            &kernel_instance("affine_split_sum", &[dtype], OP)?,
        )?),
        None => None,
    };
    // Inputs before the encoder is taken: candle ops lock the same command state.
    let x = x.contiguous()?;
    let words: Vec<u32> = tiles
        .iter()
        .flat_map(|t| [t.expert, t.row_begin, t.row_end])
        .collect();
    let tile_buffer = Tensor::from_slice(&words, words.len(), x.device())?;
    let n = x_rows * a.rows;
    let y = new_output(&dev, n, dtype, "affine_grouped_qmm_y")?;
    let (slice_cols, slices) = split.unwrap_or((0, 1));
    ensure!(
        u32::try_from(slices * n).is_ok(),
        "{OP}: {slices} slices of {n} partial sums exceed u32"
    );
    // Split-K: every threadgroup of every slice writes its plane's rows (the body's store).
    let partial = match split {
        Some(_) => Some(new_output(
            &dev,
            slices * n,
            candle_core::DType::F32,
            "affine_grouped_split_partial",
        )?),
        None => None,
    };
    let params = AffineGroupedParams {
        experts: a.experts as u32,
        rows: a.rows as u32,
        cols: a.cols as u32,
        bits: a.bits as u32,
        group_size: a.group_size as u32,
        x_rows: x_rows as u32,
        tiles: tiles.len() as u32,
        slice_cols: slice_cols as u32,
    };
    let [packed, scales, biases] = weight_buffers(a, OP)?;
    let [x_buf, tiles_buf] = metal_buffers([&x, &tile_buffer], OP)?;
    let written = from_start(partial.as_ref().unwrap_or(&y));
    encode(
        &dev,
        &gemm,
        &reads_then_writes(
            &[&packed, &scales, &biases, &x_buf, &tiles_buf],
            &[&written],
        ),
        &params,
        size(a.rows.div_ceil(GROUPED_TILE_COLS), tiles.len(), slices),
        size(GROUPED_THREADS, 1, 1),
        GROUPED_SCRATCH_BYTES,
    )?;
    if let Some(sum) = &sum {
        let params = AffineSplitSumParams {
            n: n as u32,
            slices: slices as u32,
        };
        encode(
            &dev,
            sum,
            &reads_then_writes(&[&written], &[&from_start(&y)]),
            &params,
            size(n.div_ceil(SPLIT_SUM_THREADS), 1, 1),
            size(SPLIT_SUM_THREADS, 1, 1),
            0,
        )?;
    }
    Ok(output(&dev, y, (x_rows, a.rows), dtype))
}
