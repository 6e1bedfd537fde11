//! CUDA host side of the kernels in `kernels/*.cu` (feature `cuda`): PTX compiled by this
//! crate's build script with nvcc, loaded once per device through candle's module cache and
//! launched on candle's stream, so launches order with candle's own ops.
//!
//! Only argument binding and launch geometry live here; what the kernels compute is checked
//! against the CPU reference on the GPU machine (`scripts/gpu/test-cuda.sh`).

pub mod affine;
pub mod gated_delta;

pub(crate) use gated_delta::gated_delta_update;

use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaView, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Layout, Shape, Storage, Tensor};

/// A shipped kernel source, compiled to PTX at build time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSource {
    GatedDelta,
    Affine,
}

impl KernelSource {
    fn ptx(self) -> &'static str {
        match self {
            Self::GatedDelta => include_str!(concat!(env!("OUT_DIR"), "/gated_delta.ptx")),
            Self::Affine => include_str!(concat!(env!("OUT_DIR"), "/affine.ptx")),
        }
    }

    /// candle caches loaded modules by this name.
    fn module(self) -> &'static str {
        match self {
            Self::GatedDelta => "qwen_gdn_gated_delta",
            Self::Affine => "qwen_gdn_affine",
        }
    }
}

/// Kernel `name` of `source` on `dev` (the module is loaded, and JIT-compiled by the driver,
/// on first use). Launch it with `dev.cuda_stream().launch_builder(&f)`: candle's stream.
pub(crate) fn function(dev: &CudaDevice, source: KernelSource, name: &str) -> Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(name, source.module(), source.ptx())?
        .into_cuda_function())
}

pub(crate) fn cuda_device(t: &Tensor, op: &str) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(dev) => Ok(dev.clone()),
        other => bail!("{op}: expected a CUDA tensor, got one on {other:?}"),
    }
}

/// The kernel-name tag of a float dtype.
pub(crate) fn dtype_tag(dtype: DType, op: &str) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("{op}: no CUDA kernel for {other:?}"),
    })
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
