//! CUDA host side of `kernels/affine_grouped.cu`: the grouped quantized GEMM of
//! [`AffineTensor::grouped_matmul_t`], one launch for every expert. The tile schedule is built
//! here from the offsets and copied to the device with the call. The dense case's split-K
//! ([`split_matmul_t`], `super::split_k`) runs the same body over column slices, then the
//! fixed-order sum of the slices.

use super::slicing::slicing;
use super::{tile_pairs_for, tile_schedule, AffineGroupedParams, SMEM_BYTES, THREADS, TILE_ROWS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_types, Element, Held, Kernel,
    KernelSource,
};
use crate::backend::kernel_instance;
use crate::ops::affine::cuda::HeldWeights;
use crate::ops::affine::AffineTensor;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const SOURCE: KernelSource = cuda_source!("affine_grouped");
/// Threads per block of the split-K sum: `kSumThreads` of kernels/affine_grouped.cu.
pub const SUM_THREADS: usize = 256;

// SAFETY: `AffineGroupedParams` is `repr(C)` of nine u32, as the kernel's struct.
unsafe impl DeviceRepr for AffineGroupedParams {}

/// The products of checked inputs (`grouped_matmul_t` checked the offsets, and
/// `supports_grouped_kernel` the shapes and dtypes), at least one pair.
pub fn grouped_matmul_t(m: &AffineTensor, x: &Tensor, offsets: &[u32]) -> Result<Tensor> {
    const OP: &str = "grouped matmul";
    let dev = cuda_device(x, OP)?;
    let x = x.contiguous()?;
    // The kernel copies x in 16-byte pieces; whole rows are (cols is a multiple of 32), so only
    // a view that starts inside a row can miss, and takes the per-expert path.
    if !(x.layout().start_offset() * x.dtype().size_in_bytes()).is_multiple_of(16) {
        return m.grouped_per_expert(&x, offsets);
    }
    let tile_pairs = tile_pairs_for(offsets);
    let schedule = tile_schedule(offsets, tile_pairs);
    let tiles = schedule.len() / 3;
    let row_blocks = m.rows.div_ceil(TILE_ROWS);
    ensure!(
        tiles > 0 && tiles <= i32::MAX as usize && row_blocks <= 65535,
        "{OP}: {tiles} tiles of {row_blocks} row blocks do not fit the CUDA grid"
    );
    let schedule = if tiles == 1 {
        single_tile_schedule(&schedule, x.device())?
    } else {
        Tensor::from_vec(schedule, tiles * 3, x.device())?
    };
    with_float_types!(x.dtype(), m.scales.dtype(), OP, |X, S| {
        grouped_as::<X, S>(
            m,
            &x,
            &schedule,
            [tiles, tile_pairs, row_blocks],
            (0, 1),
            &dev,
        )
    })
}

/// The split-K products of one matrix (`m.experts == 1`) and 2-D `x` of 1..=[`super::TILE_PAIRS`]
/// rows, where [`AffineTensor::has_split_kernel`] holds: the grouped body over
/// [`slicing`]'s column slices into an f32 workspace, then `affine_split_sum_*` (one launch
/// writing y when one slice covers the matrix).
pub fn split_matmul_t(m: &AffineTensor, x: &Tensor) -> Result<Tensor> {
    const OP: &str = "split-K matmul";
    let dev = cuda_device(x, OP)?;
    let x = x.contiguous()?;
    let rows_x = x.dim(0)?;
    ensure!(
        m.experts == 1 && (1..=super::TILE_PAIRS).contains(&rows_x),
        "{OP}: {rows_x} rows of x on a stack of {} experts (one matrix, 1..={} rows)",
        m.experts,
        super::TILE_PAIRS
    );
    let offsets = [0, rows_x as u32];
    let tile_pairs = tile_pairs_for(&offsets);
    let schedule = single_tile_schedule(&tile_schedule(&offsets, tile_pairs), x.device())?;
    let row_blocks = m.rows.div_ceil(TILE_ROWS);
    ensure!(
        row_blocks <= 65535,
        "{OP}: {row_blocks} row blocks do not fit the CUDA grid"
    );
    let cut = slicing(m.rows, m.cols);
    with_float_types!(x.dtype(), m.scales.dtype(), OP, |X, S| {
        grouped_as::<X, S>(m, &x, &schedule, [1, tile_pairs, row_blocks], cut, &dev)
    })
}

/// The device copy of a one-tile schedule (a batched decode step's dense product: one group
/// of at most a tile's rows, `[0, 0, rows]`), uploaded once per device and row count, so that
/// a steady step uploads none of them (and a captured graph could read it on every replay).
fn single_tile_schedule(schedule: &[u32], device: &candle_core::Device) -> Result<Tensor> {
    use std::cell::RefCell;
    thread_local! {
        static KEPT: RefCell<Vec<(Vec<u32>, Tensor)>> = const { RefCell::new(Vec::new()) };
    }
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let found = kept
            .iter()
            .find(|(words, t)| words == schedule && t.device().same_device(device));
        if let Some((_, t)) = found {
            return Ok(t.clone());
        }
        let t = Tensor::from_slice(schedule, schedule.len(), device)?;
        // One entry per row count (at most a tile's) and device: bounded by construction.
        kept.push((schedule.to_vec(), t.clone()));
        Ok(t)
    })
}

fn grouped_as<X, S>(
    m: &AffineTensor,
    x: &Tensor,
    schedule: &Tensor,
    [tiles, tile_pairs, row_blocks]: [usize; 3],
    (slice_steps, slices): (usize, usize),
    dev: &CudaDevice,
) -> Result<Tensor>
where
    X: Element,
    S: Element,
{
    const OP: &str = "grouped matmul";
    let split = slices > 1;
    let entry = if split {
        "affine_grouped_split"
    } else {
        "affine_grouped"
    };
    let name = kernel_instance(entry, &[X::DTYPE, S::DTYPE], OP)?;
    let kernel = Kernel::load_with_shared(dev, &SOURCE, &name, SMEM_BYTES)?;
    let pairs = x.dim(0)?;
    let n = pairs * m.rows;
    // SAFETY: the schedule covers every pair, and the kernel writes every row of a pair (split:
    // every slice's plane of the workspace, then the sum every element of y).
    let y = unsafe { dev.alloc::<X>(n)? };
    let partial = if split {
        // SAFETY: every block of every slice writes its plane's rows (the body's store).
        Some(unsafe { dev.alloc::<f32>(slices * n)? })
    } else {
        None
    };
    {
        let weights = HeldWeights::new(m);
        let [x_held, tiles_held] = [x, schedule].map(Held::new);
        let weight_views = weights.views::<S>(OP)?;
        let x_view = x_held.view::<X>(OP)?;
        let tiles_view = tiles_held.view::<u32>(OP)?;
        let p = AffineGroupedParams {
            rows: m.rows as u32,
            cols: m.cols as u32,
            bits: m.bits as u32,
            group_size: m.group_size as u32,
            experts: m.experts as u32,
            pairs: pairs as u32,
            tiles: tiles as u32,
            tile_pairs: tile_pairs as u32,
            slice_steps: if split { slice_steps as u32 } else { 0 },
        };
        let mut args = kernel.args();
        weight_views.push(&mut args);
        args.arg(&x_view).arg(&tiles_view);
        match &partial {
            Some(partial) => args.arg(partial),
            None => args.arg(&y),
        };
        args.arg(&p);
        let grid = (tiles as u32, row_blocks as u32, slices as u32);
        let geometry = config(grid, (THREADS as u32, 1, 1), SMEM_BYTES);
        // SAFETY: arguments in the order and types of `affine_grouped_*` in
        // kernels/affine_grouped.cu; x holds `pairs` rows of cols values, the schedule `tiles`
        // entries inside them, and the stack `experts * rows` rows.
        unsafe { launch(args, geometry) }?;
    }
    if let Some(partial) = &partial {
        let sum = Kernel::load(
            dev,
            &SOURCE,
            &kernel_instance("affine_split_sum", &[X::DTYPE], OP)?,
        )?;
        let (n32, slices32) = (n as u32, slices as u32);
        let mut args = sum.args();
        args.arg(partial).arg(&y).arg(&n32).arg(&slices32);
        let blocks = n.div_ceil(SUM_THREADS) as u32;
        // SAFETY: `affine_split_sum_*`'s (partial, y, n, slices): partial holds `slices` planes
        // of n values, y n.
        unsafe { launch(args, config((blocks, 1, 1), (SUM_THREADS as u32, 1, 1), 0)) }?;
    }
    Ok(tensor(y, dev, (pairs, m.rows)))
}
