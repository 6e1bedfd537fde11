//! CUDA host side of `kernels/affine.cu`: the two operations the device plan needs from an
//! [`AffineTensor`] (direct products for few activation rows, row dequantization for the
//! rest), with the same meaning as the CPU twin in `affine_tensor.rs`.

use super::{
    decode_products, mma, split, stream, wide, AffineParams, AffineTensor, DecodeProducts,
    ProductKind, Products,
};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, view_or, with_float_types, Element, Held,
    Kernel, KernelSource,
};
use crate::backend::kernel_instance;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, LaunchArgs, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, DType, Tensor, WithDType};

const SOURCE: KernelSource = cuda_source!("affine");
const STREAM_SOURCE: KernelSource = cuda_source!("affine_stream");
/// The one-pass row entries (opt-in): a module of their own, JIT-compiled only where used.
const STREAM_ROWS_SOURCE: KernelSource = cuda_source!("affine_stream_rows");
/// The tensor-core decode products (kernels/affine_mma.cu).
const MMA_SOURCE: KernelSource = cuda_source!("affine_mma");

// SAFETY: `AffineParams` is `repr(C)` of seven u32, as the kernel's struct.
unsafe impl DeviceRepr for AffineParams {}

/// Warps (output values) per block of the products kernel.
const WARPS_PER_BLOCK: u32 = 8;
/// Dynamic shared memory a block gets without raising the kernel's limit.
const DEFAULT_SHARED_BYTES: usize = 48 * 1024;
/// Threads per block of the dequantize kernel.
const DEQUANTIZE_BLOCK: u32 = 256;

/// The storages of a stacked matrix's packed words, scales and biases, held while their views
/// are bound: what every affine kernel reads (the grouped GEMM's too).
pub(crate) struct HeldWeights<'a> {
    pub(crate) packed: Held<'a>,
    scales: Held<'a>,
    biases: Held<'a>,
}

impl<'a> HeldWeights<'a> {
    pub(crate) fn new(m: &'a AffineTensor) -> Self {
        Self {
            packed: Held::new(&m.packed),
            scales: Held::new(&m.scales),
            biases: Held::new(&m.biases),
        }
    }

    /// The packed words, and the scales and biases in `S`.
    pub(crate) fn views<S: CudaDType + DeviceRepr>(&self, op: &str) -> Result<WeightViews<'_, S>> {
        Ok(WeightViews {
            packed: self.packed.view(op)?,
            scales: self.scales.view(op)?,
            biases: self.biases.view(op)?,
        })
    }
}

/// The device views of [`HeldWeights`], bound first in every affine kernel's arguments.
pub(crate) struct WeightViews<'a, S> {
    pub(crate) packed: CudaView<'a, u32>,
    pub(crate) scales: CudaView<'a, S>,
    pub(crate) biases: CudaView<'a, S>,
}

impl<'a, S> WeightViews<'a, S> {
    /// Pushes the packed words, the scales and the biases, in that order.
    pub(crate) fn push(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.packed).arg(&self.scales).arg(&self.biases);
    }
}

/// The products of `call` (see [`Products`]).
pub(crate) fn products(m: &AffineTensor, call: &Products) -> Result<Tensor> {
    let op = call.op();
    let dev = cuda_device(call.x, op)?;
    ensure!(
        call.out_rows <= 65535,
        "{op}: {} output rows exceed the CUDA grid",
        call.out_rows
    );
    let x = call.x.contiguous()?;
    let ids = call.ids.map(|t| t.contiguous()).transpose()?;
    let call = Products {
        x: &x,
        ids: ids.as_ref(),
        ..*call
    };
    with_float_types!(x.dtype(), m.scales.dtype(), op, |X, S| {
        products_as::<X, S>(m, &call, &dev)
    })
}

/// `call`, its x and ids contiguous.
fn products_as<X, S>(m: &AffineTensor, call: &Products, dev: &CudaDevice) -> Result<Tensor>
where
    X: Element,
    S: Element,
{
    const OP: &str = "affine matmul";
    let Products {
        kind,
        x,
        ids,
        x_div,
        out_rows,
    } = *call;
    let y_cols = call.width(m);
    let swiglu = kind == ProductKind::Swiglu;
    let dense = !swiglu && ids.is_none() && x_div == 1;
    let geometry = if wide_fits::<X>(m, x) {
        let lpr = wide::lanes_per_row(m.bits, m.cols);
        // Every row count a product of this matrix takes (one token, a verify pass's or a
        // batched step's row products, gathered experts): each output row's sums do not depend
        // on the others, so a row gets the bits it gets alone, as speculative decoding and
        // batching need. (Not the one-pass rows: their sums are the streamed kernels'.)
        if decode_products() == DecodeProducts::Auto
            && mma::preferred(m.bits, m.group_size, m.cols, y_cols, X::DTYPE)
            && scale_pairs_aligned(m)
        {
            Geometry::Mma {
                launch: mma::launch(m.group_size, m.cols, y_cols, out_rows, swiglu, sms(dev)?),
            }
        } else if dense
            && super::dense_rows::one_pass()
            && stream::pass_covers(m.bits, m.group_size, m.cols, out_rows)
        {
            Geometry::Pass {
                lpr,
                launch: stream::pass_launch(m.bits, m.cols, y_cols, out_rows, sms(dev)?),
            }
        } else if !swiglu
            && split::chooses(m.bits, m.group_size, m.cols, y_cols, out_rows, sms(dev)?)
        {
            Geometry::Split {
                rows: split::rows_per_block(y_cols, out_rows, sms(dev)?),
            }
        } else if stream::covers(m.bits, m.group_size, m.cols) {
            Geometry::Stream {
                lpr,
                launch: stream::launch(m.bits, m.cols, y_cols, out_rows, swiglu, sms(dev)?),
            }
        } else {
            let rows = wide::rows_per_group(y_cols, out_rows, lpr, swiglu, sms(dev)?);
            Geometry::Wide { lpr, rows }
        }
    } else {
        Geometry::WarpPerRow
    };
    let kind_name = if swiglu { "swiglu" } else { "products" };
    let (source, name) = match geometry {
        Geometry::Mma { .. } => (&MMA_SOURCE, format!("affine_mma_{kind_name}_b4")),
        Geometry::Pass { launch, .. } => (
            &STREAM_ROWS_SOURCE,
            format!(
                "affine_stream_rows_b{}_t{}_s{}",
                m.bits,
                stream::pass_capacity(out_rows),
                launch.steps
            ),
        ),
        Geometry::Stream { launch, .. } => (
            &STREAM_SOURCE,
            format!(
                "affine_stream_{kind_name}_b{}_r{}_s{}",
                m.bits, launch.rows, launch.steps
            ),
        ),
        Geometry::Wide { rows, .. } => (
            &SOURCE,
            format!("affine_wide_{kind_name}_b{}_r{rows}", m.bits),
        ),
        Geometry::Split { rows } => (
            &SOURCE,
            format!("affine_split_products_b{}_r{rows}", m.bits),
        ),
        Geometry::WarpPerRow if swiglu => (&SOURCE, "affine_products_swiglu".to_string()),
        Geometry::WarpPerRow => (&SOURCE, "affine_products".to_string()),
    };
    let pass_shared = stream::pass_shared_bytes(m.bits, m.cols, out_rows);
    let kernel = match geometry {
        // The rings of 8 warps take ~87 KB at 6 144 columns: past the default 48 KB a block the
        // launch fails unless the kernel's limit is raised.
        Geometry::Mma { launch } => {
            let bytes = mma::shared_bytes(m.group_size, m.cols, launch.warps);
            let instance = kernel_instance(&name, &[X::DTYPE, S::DTYPE], OP)?;
            if bytes > DEFAULT_SHARED_BYTES {
                Kernel::load_with_shared(dev, source, &instance, bytes)?
            } else {
                Kernel::load(dev, source, &instance)?
            }
        }
        // Past the default 48 KB a block the launch fails unless the kernel's limit is raised.
        Geometry::Pass { .. } if pass_shared > DEFAULT_SHARED_BYTES => {
            let instance = kernel_instance(&name, &[X::DTYPE, S::DTYPE], OP)?;
            Kernel::load_with_shared(dev, source, &instance, pass_shared)?
        }
        _ => Kernel::typed(dev, source, &name, &[X::DTYPE, S::DTYPE], OP)?,
    };
    // SAFETY: the kernel writes every element of y.
    let y = unsafe { dev.alloc::<X>(out_rows * y_cols)? };
    {
        let weights = HeldWeights::new(m);
        let (x_held, ids_held) = (Held::new(x), ids.map(Held::new));
        let weight_views = weights.views::<S>(OP)?;
        let x_view = x_held.view::<X>(OP)?;
        // Never read without ids (has_ids = 0).
        let ids_view = view_or::<u32>(&ids_held, &weights.packed, OP)?;
        let p = AffineParams::new(m, m.rows, out_rows, x_div, ids.is_some());
        let experts = m.experts as u32;
        let mut args = kernel.args();
        weight_views.push(&mut args);
        args.arg(&x_view);
        // The one-pass kernels take neither ids nor experts (dense products).
        if !matches!(geometry, Geometry::Pass { .. }) {
            args.arg(&ids_view);
        }
        args.arg(&y).arg(&p);
        if !matches!(geometry, Geometry::Pass { .. }) {
            args.arg(&experts);
        }
        let lpr_arg;
        let blocks = match geometry {
            // The tensor-core kernels take no lanes-per-row.
            Geometry::Mma { launch } => config(
                (launch.blocks_x as u32, out_rows as u32, 1),
                (32 * launch.warps as u32, 1, 1),
                mma::shared_bytes(m.group_size, m.cols, launch.warps),
            ),
            Geometry::Pass { lpr, launch } => {
                lpr_arg = lpr as u32;
                args.arg(&lpr_arg);
                config(
                    (launch.blocks_x as u32, 1, 1),
                    (32 * stream::WARPS as u32, 1, 1),
                    pass_shared,
                )
            }
            Geometry::Stream { lpr, launch } => {
                lpr_arg = lpr as u32;
                args.arg(&lpr_arg);
                config(
                    (launch.blocks_x as u32, out_rows as u32, 1),
                    (32 * stream::WARPS as u32, 1, 1),
                    stream::shared_bytes(m.bits, m.cols),
                )
            }
            Geometry::Wide { lpr, rows } => {
                lpr_arg = lpr as u32;
                args.arg(&lpr_arg);
                let blocks_x = wide::blocks_x(y_cols, lpr, rows) as u32;
                config(
                    (blocks_x, out_rows as u32, 1),
                    (32 * wide::WARPS as u32, 1, 1),
                    0,
                )
            }
            Geometry::Split { rows } => config(
                (split::blocks_x(y_cols, rows) as u32, out_rows as u32, 1),
                (32 * split::WARPS as u32, 1, 1),
                0,
            ),
            Geometry::WarpPerRow => {
                let blocks_x = (y_cols as u32).div_ceil(WARPS_PER_BLOCK);
                config((blocks_x, out_rows as u32, 1), (32, WARPS_PER_BLOCK, 1), 0)
            }
        };
        // SAFETY: arguments in the order and types of `affine_products_*` and
        // `affine_products_swiglu_*` (and, with the trailing lanes-per-row, `affine_wide_*`) in
        // kernels/affine.cu (the streamed ones, `affine_stream_*` in kernels/affine_stream.cu,
        // take the wide ones' arguments, `affine_stream_rows_*` the same without ids and
        // experts, the split ones the products' arguments, `affine_mma_*` the products'
        // arguments: the wide ones' without lanes-per-row); x holds (out_rows - 1) / x_div + 1
        // rows of cols values; the wide and streamed kernels' 16-byte loads were checked to be aligned
        // (`wide_fits`).
        unsafe { launch(args, blocks) }?;
    }
    Ok(tensor(y, dev, (out_rows, y_cols)))
}

/// Which products kernel a launch takes.
#[derive(Clone, Copy)]
enum Geometry {
    /// `affine_mma_*`: the tensor-core decode products (see [`mma`]); their own sums, within
    /// bf16 tolerance of the others'.
    Mma { launch: mma::Launch },
    /// `affine_products*`: one warp per output row, any width (the reference for the rest).
    WarpPerRow,
    /// `affine_wide_*`: `lpr` lanes per row, `rows` outputs per row group (see [`wide`]).
    Wide { lpr: usize, rows: usize },
    /// `affine_stream_*`: the wide kernels' sums, streamed (see [`stream`]).
    Stream { lpr: usize, launch: stream::Launch },
    /// `affine_stream_rows_*`: the streamed sums of 2..=8 dense rows in one pass over the
    /// weights, each row's bits as alone (see [`stream::pass_launch`]).
    Pass { lpr: usize, launch: stream::Launch },
    /// `affine_split_products_*`: the wide kernels' sums, a block of warps on each of `rows`
    /// rows (few rows, long rows: see [`split`]).
    Split { rows: usize },
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

/// Whether a pair of scales (biases) of an even group starts on twice its size, as the
/// tensor-core kernels' copies of a pair need: the scales' and biases' views start on an even
/// element (the row's group count is even, [`mma::covers`]).
fn scale_pairs_aligned(m: &AffineTensor) -> bool {
    m.scales.layout().start_offset().is_multiple_of(2)
        && m.biases.layout().start_offset().is_multiple_of(2)
}

/// The device's streaming multiprocessors (the wide kernels size their grids by it), read once
/// per device.
pub(crate) fn sms(dev: &CudaDevice) -> Result<usize> {
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
    O: Element,
    S: Element,
{
    const OP: &str = "affine dequantize";
    let kernel = Kernel::typed(dev, &SOURCE, "affine_dequantize", &[O::DTYPE, S::DTYPE], OP)?;
    let len = count * m.cols;
    ensure!(
        len <= u32::MAX as usize,
        "{OP}: {count} rows of {} values exceed the CUDA grid",
        m.cols
    );
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<O>(len)? };
    if len > 0 {
        let weights = HeldWeights::new(m);
        let ids_held = ids.map(Held::new);
        let weight_views = weights.views::<S>(OP)?;
        // Never read without ids (has_ids = 0).
        let ids_view = view_or::<u32>(&ids_held, &weights.packed, OP)?;
        let p = AffineParams::new(m, m.rows, count, 1, ids.is_some());
        let (count32, total_rows) = (count as u32, (m.experts * m.rows) as u32);
        let mut args = kernel.args();
        weight_views.push(&mut args);
        args.arg(&ids_view)
            .arg(&out)
            .arg(&p)
            .arg(&count32)
            .arg(&total_rows);
        let blocks = (len as u32).div_ceil(DEQUANTIZE_BLOCK);
        let geometry = config((blocks, 1, 1), (DEQUANTIZE_BLOCK, 1, 1), 0);
        // SAFETY: arguments in the order and types of `affine_dequantize_*` in
        // kernels/affine.cu.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(out, dev, (count, m.cols)))
}
