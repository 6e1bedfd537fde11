//! CUDA host side of `kernels/affine_grouped.cu`: the grouped quantized GEMM of
//! [`AffineTensor::grouped_matmul_t`], one launch for every expert. The tile schedule is built
//! here from the offsets and copied to the device with the call.

use super::{tile_pairs_for, tile_schedule, AffineGroupedParams, SMEM_BYTES, THREADS, TILE_ROWS};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use crate::ops::affine::AffineTensor;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor, WithDType};

const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_affine_grouped",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/affine_grouped.ptx")),
};

// SAFETY: `AffineGroupedParams` is `repr(C)` of eight u32, as the kernel's struct.
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
    let schedule = Tensor::from_vec(schedule, tiles * 3, x.device())?;
    with_float_type!(x.dtype(), OP, |X| with_float_type!(
        m.scales.dtype(),
        OP,
        |S| grouped_as::<X, S>(m, &x, &schedule, [tiles, tile_pairs, row_blocks], &dev)
    ))
}

fn grouped_as<X, S>(
    m: &AffineTensor,
    x: &Tensor,
    schedule: &Tensor,
    [tiles, tile_pairs, row_blocks]: [usize; 3],
    dev: &CudaDevice,
) -> Result<Tensor>
where
    X: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    const OP: &str = "grouped matmul";
    let name = format!(
        "affine_grouped_{}_{}",
        dtype_tag(X::DTYPE, OP)?,
        dtype_tag(S::DTYPE, OP)?
    );
    let func = function(dev, &SOURCE, &name)?;
    func.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        SMEM_BYTES as i32,
    )?;
    let pairs = x.dim(0)?;
    // SAFETY: the schedule covers every pair, and the kernel writes every row of a pair.
    let y = unsafe { dev.alloc::<X>(pairs * m.rows)? };
    {
        let (ps, pl) = m.packed.storage_and_layout();
        let (ss, sl) = m.scales.storage_and_layout();
        let (bs, bl) = m.biases.storage_and_layout();
        let (xs, xl) = x.storage_and_layout();
        let (ts, tl) = schedule.storage_and_layout();
        let packed = view::<u32>(&ps, pl, OP)?;
        let (scales, biases) = (view::<S>(&ss, sl, OP)?, view::<S>(&bs, bl, OP)?);
        let x_view = view::<X>(&xs, xl, OP)?;
        let tiles_view = view::<u32>(&ts, tl, OP)?;
        let p = AffineGroupedParams {
            rows: m.rows as u32,
            cols: m.cols as u32,
            bits: m.bits as u32,
            group_size: m.group_size as u32,
            experts: m.experts as u32,
            pairs: pairs as u32,
            tiles: tiles as u32,
            tile_pairs: tile_pairs as u32,
        };
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&packed)
            .arg(&scales)
            .arg(&biases)
            .arg(&x_view)
            .arg(&tiles_view)
            .arg(&y)
            .arg(&p);
        let config = LaunchConfig {
            grid_dim: (tiles as u32, row_blocks as u32, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: SMEM_BYTES as u32,
        };
        // SAFETY: arguments in the order and types of `affine_grouped_*` in
        // kernels/affine_grouped.cu; x holds `pairs` rows of cols values, the schedule `tiles`
        // entries inside them, and the stack `experts * rows` rows.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(y, dev, (pairs, m.rows)))
}
