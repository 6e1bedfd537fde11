//! CUDA host side shared by every op (feature `cuda`): PTX compiled by this crate's build
//! script with nvcc (every `kernels/*.cu`), loaded once per device through candle's module
//! cache and launched on candle's stream, so launches order with candle's own ops.
//!
//! Only argument binding and launch geometry live in the ops' `cuda.rs`; what the kernels
//! compute is checked against the CPU twins on the GPU machine (`scripts/gpu/test-cuda.sh`).

use crate::launches;
use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaView, DeviceRepr, LaunchArgs, LaunchConfig,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Device, Layout, Shape, Storage, Tensor};

/// Calls `$body` with `$T` bound to the Rust type of a float dtype (f32, f16, bf16), or fails
/// with "`$op`: no CUDA kernel for …": every op's dtype dispatch to its kernel instantiations.
macro_rules! with_float_type {
    ($dtype:expr, $op:expr, |$T:ident| $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $T = f32;
                $body
            }
            candle_core::DType::F16 => {
                type $T = half::f16;
                $body
            }
            candle_core::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => anyhow::bail!("{}: no CUDA kernel for {other:?}", $op),
        }
    };
}
pub(crate) use with_float_type;

/// A shipped kernel source, compiled to PTX at build time: declare one per op with
/// `include_str!(concat!(env!("OUT_DIR"), "/<op>.ptx"))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// candle caches loaded modules by this name.
    pub module: &'static str,
    pub ptx: &'static str,
}

/// Kernel `name` of `source` on `dev` (the module is loaded, and JIT-compiled by the driver,
/// on first use). Launch it with `dev.cuda_stream().launch_builder(&f)`: candle's stream.
pub(crate) fn function(
    dev: &CudaDevice,
    source: &KernelSource,
    name: &str,
) -> Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(name, source.module, source.ptx)?
        .into_cuda_function())
}

/// Launches a bound kernel. Every CUDA launch of this crate goes through here, so this is
/// where launches are counted and, when profiling, their geometry noted
/// ([`crate::profile::record::note_grid`]).
///
/// # Safety
/// The arguments pushed on `args` must match the kernel's signature, in order and type, and
/// every view must cover the elements the kernel indexes under `config`.
pub(crate) unsafe fn launch(mut args: LaunchArgs, config: LaunchConfig) -> Result<()> {
    launches::record(1);
    let (g, b) = (config.grid_dim, config.block_dim);
    crate::profile::record::note_grid([g.0, g.1, g.2], [b.0, b.1, b.2]);
    unsafe { args.launch(config) }?;
    Ok(())
}

pub(crate) fn cuda_device(t: &Tensor, op: &str) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(dev) => Ok(dev.clone()),
        other => bail!("{op}: expected a CUDA tensor, got one on {other:?}"),
    }
}

/// The elements of a contiguous tensor as a device view. `storage` and `layout` are what
/// `Tensor::storage_and_layout` returned; the caller keeps its guard alive meanwhile.
pub(crate) fn view<'a, T: CudaDType + DeviceRepr>(
    storage: &'a Storage,
    layout: &Layout,
    op: &str,
) -> Result<CudaView<'a, T>> {
    let Storage::Cuda(s) = storage else {
        bail!("{op}: expected a CUDA tensor")
    };
    ensure!(layout.is_contiguous(), "{op}: inputs must be contiguous");
    let start = layout.start_offset();
    let len = layout.shape().elem_count();
    Ok(s.as_cuda_slice::<T>()?.slice(start..start + len))
}

/// Wraps a freshly written device buffer as a contiguous tensor.
pub(crate) fn tensor<T: CudaDType>(
    slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
    dev: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(slice, dev.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// The elements `rows.start .. rows.start + rows.span` of a tensor's storage as a device
/// view: for views whose layout the caller has checked with [`super::row_layout`].
pub(crate) fn rows_view<'a, T: CudaDType + DeviceRepr>(
    storage: &'a Storage,
    rows: &super::RowLayout,
    op: &str,
) -> Result<CudaView<'a, T>> {
    let Storage::Cuda(s) = storage else {
        bail!("{op}: expected a CUDA tensor")
    };
    Ok(s.as_cuda_slice::<T>()?
        .slice(rows.start..rows.start + rows.span))
}
