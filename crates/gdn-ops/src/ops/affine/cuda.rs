//! CUDA host side of `kernels/affine.cu`: the two operations the device plan needs from an
//! [`AffineTensor`] (direct products for few activation rows, row dequantization for the
//! rest), with the same meaning as the CPU twin in `affine_tensor.rs`.

use super::{wide, AffineParams, AffineTensor};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, DType, Tensor, WithDType};

const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_affine",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/affine.ptx")),
};

// SAFETY: `AffineParams` is `repr(C)` of seven u32, as the kernel's struct.
unsafe impl DeviceRepr for AffineParams {}

/// Warps (output values) per block of the products kernel.
const WARPS_PER_BLOCK: u32 = 8;
/// Threads per block of the dequantize kernel.
const DEQUANTIZE_BLOCK: u32 = 256;

fn params(m: &AffineTensor, out_rows: usize, x_div: usize, has_ids: bool) -> AffineParams {
    AffineParams {
        rows: m.rows as u32,
        cols: m.cols as u32,
        bits: m.bits as u32,
        group_size: m.group_size as u32,
        out_rows: out_rows as u32,
        x_div: x_div as u32,
        has_ids: has_ids as u32,
    }
}

/// Calls `$body` with `$X` and `$S` bound to the Rust types of two float dtypes (values and
/// scales): the nine instantiations of each kernel.
macro_rules! with_float_types {
    ($x:expr, $s:expr, $op:expr, |$X:ident, $S:ident| $body:expr) => {
        with_float_type!($x, $op, |$X| with_float_type!($s, $op, |$S| $body))
    };
}

/// `out_rows` products; output row `i` reads x row `i / x_div` and expert `ids[i]` (or 0).
pub(crate) fn products(
    m: &AffineTensor,
    x: &Tensor,
    ids: Option<&Tensor>,
    x_div: usize,
    out_rows: usize,
) -> Result<Tensor> {
    const OP: &str = "affine matmul";
    let dev = cuda_device(x, OP)?;
    ensure!(
        out_rows <= 65535,
        "{OP}: {out_rows} output rows exceed the CUDA grid"
    );
    let x = x.contiguous()?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    with_float_types!(x.dtype(), m.scales.dtype(), OP, |X, S| {
        products_as::<X, S>(m, &x, ids.as_ref(), x_div, out_rows, &dev, Kind::Products)
    })
}

/// SwiGLU activations of a stacked gate-and-up matrix: output row `i` reads x row
/// `i / x_div` with expert `ids[i]` and holds `m.rows / 2` values.
pub(crate) fn swiglu_products(
    m: &AffineTensor,
    x: &Tensor,
    ids: &Tensor,
    x_div: usize,
    out_rows: usize,
) -> Result<Tensor> {
    const OP: &str = "expert swiglu";
    let dev = cuda_device(x, OP)?;
    ensure!(
        out_rows <= 65535,
        "{OP}: {out_rows} output rows exceed the CUDA grid"
    );
    let x = x.contiguous()?;
    let ids = ids.contiguous()?;
    with_float_types!(x.dtype(), m.scales.dtype(), OP, |X, S| {
        products_as::<X, S>(m, &x, Some(&ids), x_div, out_rows, &dev, Kind::Swiglu)
    })
}

/// Which of the two product kernels: plain rows, or the SwiGLU of gate and up rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Products,
    Swiglu,
}

fn products_as<X, S>(
    m: &AffineTensor,
    x: &Tensor,
    ids: Option<&Tensor>,
    x_div: usize,
    out_rows: usize,
    dev: &CudaDevice,
    kind: Kind,
) -> Result<Tensor>
where
    X: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    const OP: &str = "affine matmul";
    let y_cols = match kind {
        Kind::Products => m.rows,
        Kind::Swiglu => m.rows / 2,
    };
    let geometry = if wide_fits::<X>(m, x) {
        let lpr = wide::lanes_per_row(m.bits, m.cols);
        let rows = wide::rows_per_group(y_cols, out_rows, lpr, kind == Kind::Swiglu, sms(dev)?);
        Geometry::Wide { lpr, rows }
    } else {
        Geometry::WarpPerRow
    };
    let name = match (geometry, kind) {
        (Geometry::Wide { rows, .. }, Kind::Products) => {
            format!("affine_wide_products_b{}_r{rows}", m.bits)
        }
        (Geometry::Wide { rows, .. }, Kind::Swiglu) => {
            format!("affine_wide_swiglu_b{}_r{rows}", m.bits)
        }
        (Geometry::WarpPerRow, Kind::Products) => "affine_products".to_string(),
        (Geometry::WarpPerRow, Kind::Swiglu) => "affine_products_swiglu".to_string(),
    };
    let name = format!(
        "{name}_{}_{}",
        dtype_tag(X::DTYPE, OP)?,
        dtype_tag(S::DTYPE, OP)?
    );
    let func = function(dev, &SOURCE, &name)?;
    // SAFETY: the kernel writes every element of y.
    let y = unsafe { dev.alloc::<X>(out_rows * y_cols)? };
    {
        let (ps, pl) = m.packed.storage_and_layout();
        let (ss, sl) = m.scales.storage_and_layout();
        let (bs, bl) = m.biases.storage_and_layout();
        let (xs, xl) = x.storage_and_layout();
        let packed = view::<u32>(&ps, pl, OP)?;
        let (scales, biases) = (view::<S>(&ss, sl, OP)?, view::<S>(&bs, bl, OP)?);
        let x_view = view::<X>(&xs, xl, OP)?;
        let ids_guard = ids.map(|t| t.storage_and_layout());
        let ids_view = match &ids_guard {
            Some((is, il)) => view::<u32>(is, il, OP)?,
            // Never read without ids (has_ids = 0).
            None => view::<u32>(&ps, pl, OP)?,
        };
        let p = params(m, out_rows, x_div, ids.is_some());
        let experts = m.experts as u32;
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&packed)
            .arg(&scales)
            .arg(&biases)
            .arg(&x_view)
            .arg(&ids_view)
            .arg(&y)
            .arg(&p)
            .arg(&experts);
        let lpr_arg;
        let config = match geometry {
            Geometry::Wide { lpr, rows } => {
                lpr_arg = lpr as u32;
                args.arg(&lpr_arg);
                LaunchConfig {
                    grid_dim: (wide::blocks_x(y_cols, lpr, rows) as u32, out_rows as u32, 1),
                    block_dim: (32 * wide::WARPS as u32, 1, 1),
                    shared_mem_bytes: 0,
                }
            }
            Geometry::WarpPerRow => LaunchConfig {
                grid_dim: (
                    (y_cols as u32).div_ceil(WARPS_PER_BLOCK),
                    out_rows as u32,
                    1,
                ),
                block_dim: (32, WARPS_PER_BLOCK, 1),
                shared_mem_bytes: 0,
            },
        };
        // SAFETY: arguments in the order and types of `affine_products_*` and
        // `affine_products_swiglu_*` (and, with the trailing lanes-per-row, `affine_wide_*`) in
        // kernels/affine.cu; x holds (out_rows - 1) / x_div + 1 rows of cols values; the wide
        // kernels' 16-byte loads were checked to be aligned (`wide_fits`).
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(y, dev, (out_rows, y_cols)))
}

/// Which products kernel a launch takes.
#[derive(Clone, Copy)]
enum Geometry {
    /// `affine_products*`: one warp per output row, any width (the reference for the rest).
    WarpPerRow,
    /// `affine_wide_*`: `lpr` lanes per row, `rows` outputs per row group (see [`wide`]).
    Wide { lpr: usize, rows: usize },
}

/// Whether the wide kernels take this matrix and input: its width and groups ([`wide::covers`])
/// and 16-byte alignment of every load (the packed rows and x's rows start on 16 bytes).
fn wide_fits<X: WithDType>(m: &AffineTensor, x: &Tensor) -> bool {
    let x_bytes = std::mem::size_of::<X>();
    wide::covers(m.bits, m.group_size, m.cols)
        && m.packed.layout().start_offset().is_multiple_of(4)
        && (x.layout().start_offset() * x_bytes).is_multiple_of(16)
        && (m.cols * x_bytes).is_multiple_of(16)
}

/// The device's streaming multiprocessors (the wide kernels size their grids by it), read once
/// per device.
fn sms(dev: &CudaDevice) -> Result<usize> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    use std::sync::OnceLock;
    static SMS: OnceLock<usize> = OnceLock::new();
    if let Some(n) = SMS.get() {
        return Ok(*n);
    }
    let n = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(*SMS.get_or_init(|| n.max(1) as usize))
}

/// Rows of the stacked matrix dequantized into `dtype`: the rows listed in `ids` or the
/// first `count`.
pub(crate) fn dequantize(
    m: &AffineTensor,
    ids: Option<&Tensor>,
    count: usize,
    dtype: DType,
) -> Result<Tensor> {
    const OP: &str = "affine dequantize";
    let dev = cuda_device(&m.packed, OP)?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    with_float_types!(dtype, m.scales.dtype(), OP, |O, S| {
        dequantize_as::<O, S>(m, ids.as_ref(), count, &dev)
    })
}

fn dequantize_as<O, S>(
    m: &AffineTensor,
    ids: Option<&Tensor>,
    count: usize,
    dev: &CudaDevice,
) -> Result<Tensor>
where
    O: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    const OP: &str = "affine dequantize";
    let name = format!(
        "affine_dequantize_{}_{}",
        dtype_tag(O::DTYPE, OP)?,
        dtype_tag(S::DTYPE, OP)?
    );
    let func = function(dev, &SOURCE, &name)?;
    let len = count * m.cols;
    ensure!(
        len <= u32::MAX as usize,
        "{OP}: {count} rows of {} values exceed the CUDA grid",
        m.cols
    );
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<O>(len)? };
    if len > 0 {
        let (ps, pl) = m.packed.storage_and_layout();
        let (ss, sl) = m.scales.storage_and_layout();
        let (bs, bl) = m.biases.storage_and_layout();
        let packed = view::<u32>(&ps, pl, OP)?;
        let (scales, biases) = (view::<S>(&ss, sl, OP)?, view::<S>(&bs, bl, OP)?);
        let ids_guard = ids.map(|t| t.storage_and_layout());
        let ids_view = match &ids_guard {
            Some((is, il)) => view::<u32>(is, il, OP)?,
            None => view::<u32>(&ps, pl, OP)?,
        };
        let p = params(m, count, 1, ids.is_some());
        let (count32, total_rows) = (count as u32, (m.experts * m.rows) as u32);
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&packed)
            .arg(&scales)
            .arg(&biases)
            .arg(&ids_view)
            .arg(&out)
            .arg(&p)
            .arg(&count32)
            .arg(&total_rows);
        let config = LaunchConfig {
            grid_dim: ((len as u32).div_ceil(DEQUANTIZE_BLOCK), 1, 1),
            block_dim: (DEQUANTIZE_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `affine_dequantize_*` in
        // kernels/affine.cu.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(out, dev, (count, m.cols)))
}
