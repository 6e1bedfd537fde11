//! CUDA host side shared by every op (feature `cuda`): PTX compiled by this crate's build
//! script with nvcc (every `kernels/*.cu`), loaded once per device through candle's module
//! cache and launched on candle's stream, so launches order with candle's own ops.
//!
//! Only argument binding and launch geometry live in the ops' `cuda.rs`; what the kernels
//! compute is checked against the CPU twins on the GPU machine (`scripts/gpu/test-cuda.sh`).

use crate::launches;
use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, LaunchArgs, LaunchConfig,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{
    CudaDevice, CudaStorage, DType, Device, Layout, Shape, Storage, StorageRef, Tensor, WithDType,
};
use std::sync::Arc;

/// Calls `$body` with `$T` bound to the Rust type of a float dtype (f32, f16, bf16), or fails
/// with "`$op`: no CUDA kernel for …" (or, given `$other => $fallback`, evaluates the
/// fallback): every op's dtype dispatch to its kernel instantiations.
macro_rules! with_float_type {
    ($dtype:expr, $op:expr, |$T:ident| $body:expr) => {
        $crate::backend::cuda::with_float_type!($dtype, |$T| $body, other => {
            anyhow::bail!("{}: no CUDA kernel for {other:?}", $op)
        })
    };
    ($dtype:expr, |$T:ident| $body:expr, $other:pat => $fallback:expr) => {
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
            $other => $fallback,
        }
    };
}
pub(crate) use with_float_type;

/// Calls `$body` with `$X` and `$S` bound to the Rust types of two float dtypes (values and
/// scales): the nine instantiations of each affine kernel.
macro_rules! with_float_types {
    ($x:expr, $s:expr, $op:expr, |$X:ident, $S:ident| $body:expr) => {
        $crate::backend::cuda::with_float_type!($x, $op, |$X| {
            $crate::backend::cuda::with_float_type!($s, $op, |$S| $body)
        })
    };
}
pub(crate) use with_float_types;

/// Calls `$body` with `$I` bound to the Rust type of an activation dtype (f32, f16, bf16) and
/// `$S` to that of a recurrent state's (f32, bf16), or fails with "`$op`: no CUDA kernel for
/// activations … with a … state": the gated-delta kernels' dtype dispatch.
macro_rules! with_input_and_state_types {
    ($input:expr, $state:expr, $op:expr, |$I:ident, $S:ident| $body:expr) => {{
        let (input, state) = ($input, $state);
        let unsupported = || {
            anyhow::anyhow!(
                "{}: no CUDA kernel for activations {input:?} with a {state:?} state",
                $op
            )
        };
        match state {
            candle_core::DType::F32 => {
                type $S = f32;
                $crate::backend::cuda::with_float_type!(input, |$I| $body, _ => Err(unsupported()))
            }
            candle_core::DType::BF16 => {
                type $S = half::bf16;
                $crate::backend::cuda::with_float_type!(input, |$I| $body, _ => Err(unsupported()))
            }
            _ => Err(unsupported()),
        }
    }};
}
pub(crate) use with_input_and_state_types;

/// A shipped kernel source, compiled to PTX at build time: declare one per op with
/// [`cuda_source!`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// candle caches loaded modules by this name.
    pub module: &'static str,
    pub ptx: &'static str,
}

/// The [`KernelSource`] of `kernels/<name>.cu`, whose PTX the build script left in OUT_DIR,
/// loaded as module `qwen_gdn_<name>`: `cuda_source!("attn_prep")`.
macro_rules! cuda_source {
    ($name:literal) => {
        $crate::backend::cuda::KernelSource {
            module: concat!("qwen_gdn_", $name),
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".ptx")),
        }
    };
}
pub(crate) use cuda_source;

/// Kernel `name` of `source` on `dev` (the module is loaded, and JIT-compiled by the driver,
/// on first use). The ops launch it through [`Kernel`], on candle's stream.
pub(crate) fn function(
    dev: &CudaDevice,
    source: &KernelSource,
    name: &str,
) -> Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(name, source.module, source.ptx)?
        .into_cuda_function())
}

/// An element type the kernels take: its device buffers bind as kernel arguments, and its
/// dtype names the instantiation.
pub(crate) trait Element: CudaDType + DeviceRepr + WithDType {}
impl<T: CudaDType + DeviceRepr + WithDType> Element for T {}

/// A loaded kernel with candle's stream, on which its launches are queued (so that they
/// order with candle's own ops).
pub(crate) struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Kernel {
    /// Kernel `name` of `source` on `dev` (see [`function`]).
    pub(crate) fn load(dev: &CudaDevice, source: &KernelSource, name: &str) -> Result<Self> {
        Ok(Self {
            func: function(dev, source, name)?,
            stream: dev.cuda_stream(),
        })
    }

    /// Kernel `kernel` of `source` instantiated for `dtypes` (see [`super::kernel_instance`]).
    pub(crate) fn typed(
        dev: &CudaDevice,
        source: &KernelSource,
        kernel: &str,
        dtypes: &[DType],
        op: &str,
    ) -> Result<Self> {
        Self::load(dev, source, &super::kernel_instance(kernel, dtypes, op)?)
    }

    /// As [`Kernel::load`], allowed `bytes` of dynamic shared memory a block: the launches of
    /// kernels that take more than the default 48 KB fail without this.
    pub(crate) fn load_with_shared(
        dev: &CudaDevice,
        source: &KernelSource,
        name: &str,
        bytes: usize,
    ) -> Result<Self> {
        let kernel = Self::load(dev, source, name)?;
        kernel.func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )?;
        Ok(kernel)
    }

    /// An empty argument list for one launch: push the kernel's arguments in order, then
    /// [`launch`] it.
    pub(crate) fn args(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

/// The geometry of one launch: `grid` blocks of `block` threads, each block with
/// `shared_bytes` of dynamic shared memory.
pub(crate) fn config(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: usize,
) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: shared_bytes as u32,
    }
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

/// A tensor's storage, read-locked for as long as device views of it are bound to launches
/// (a view borrows from it), with the tensor's layout.
pub(crate) struct Held<'t> {
    storage: StorageRef<'t>,
    layout: &'t Layout,
}

impl<'t> Held<'t> {
    pub(crate) fn new(t: &'t Tensor) -> Self {
        let (storage, layout) = t.storage_and_layout();
        Self { storage, layout }
    }

    fn slice<T: CudaDType + DeviceRepr>(&self, op: &str) -> Result<&CudaSlice<T>> {
        let Storage::Cuda(s) = &*self.storage else {
            bail!("{op}: expected a CUDA tensor")
        };
        Ok(s.as_cuda_slice::<T>()?)
    }

    /// The elements of a contiguous tensor as a device view.
    pub(crate) fn view<T: CudaDType + DeviceRepr>(&self, op: &str) -> Result<CudaView<'_, T>> {
        ensure!(
            self.layout.is_contiguous(),
            "{op}: inputs must be contiguous"
        );
        let start = self.layout.start_offset();
        let len = self.layout.shape().elem_count();
        Ok(self.slice::<T>(op)?.slice(start..start + len))
    }

    /// The device address of a contiguous tensor's first element, as a slot table holds it
    /// ([`slot_table`]). The tensor stays read-locked while `self` lives; the caller keeps it
    /// alive until the launch that reads the address is queued.
    pub(crate) fn address<T: CudaDType + DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        op: &str,
    ) -> Result<u64> {
        let view = self.view::<T>(op)?;
        let (ptr, _sync) = view.device_ptr(stream);
        Ok(ptr)
    }

    /// The elements `rows.start .. rows.start + rows.span` of the storage as a device view:
    /// for views whose layout the caller has checked with [`super::row_layout`].
    pub(crate) fn rows<T: CudaDType + DeviceRepr>(
        &self,
        rows: &super::RowLayout,
        op: &str,
    ) -> Result<CudaView<'_, T>> {
        Ok(self
            .slice::<T>(op)?
            .slice(rows.start..rows.start + rows.span))
    }
}

/// The table of device addresses a slot kernel reads its sequences' buffers through (see
/// `ops::gated_delta_norm_slots` for why a table): `words` (a sequence's [`Held::address`]es
/// and plain numbers such as its capacity), uploaded on candle's stream, so that the launch
/// that reads it is ordered after the copy, when no table of the same words on `dev` is kept
/// ([`crate::slot_tables`]: once per batch composition; counted there).
pub(crate) fn slot_table(dev: &CudaDevice, words: &[u64]) -> Result<Arc<CudaSlice<u64>>> {
    let ordinal = dev.cuda_stream().context().ordinal() as u64;
    let key: Vec<u64> = std::iter::once(ordinal)
        .chain(words.iter().copied())
        .collect();
    let table = crate::slot_tables::DEVICE.with(|t| {
        t.borrow_mut()
            .get_or_upload(&key, |_| Ok(Arc::new(dev.clone_htod(words)?)))
    })?;
    crate::slot_tables::handed_out(&table);
    Ok(table)
}

/// The [`slot_table`] of one address a sequence: each of `held`'s contiguous tensors (a
/// sequence's state), typed `T`.
pub(crate) fn address_table<T: CudaDType + DeviceRepr>(
    dev: &CudaDevice,
    held: &[Held],
    op: &str,
) -> Result<Arc<CudaSlice<u64>>> {
    let stream = dev.cuda_stream();
    let words = held
        .iter()
        .map(|h| h.address::<T>(&stream, op))
        .collect::<Result<Vec<_>>>()?;
    slot_table(dev, &words)
}

/// Each sequence's KV buffers and position, read-locked while a slot launch that reads them
/// through its table is bound (`attn_prep_slots`, `attn_decode_slots`).
pub(crate) struct HeldKv<'t>(Vec<[Held<'t>; 3]>);

impl<'t> HeldKv<'t> {
    /// `rows`: each sequence's keys, values (`[1, Nkv, cap, Dh]`) and `[1]` u32 position.
    pub(crate) fn new(rows: impl Iterator<Item = [&'t Tensor; 3]>) -> Self {
        Self(rows.map(|r| r.map(Held::new)).collect())
    }

    /// Each sequence's first table words: the addresses of its keys and values (in `T`) and
    /// of its position.
    pub(crate) fn addresses<T: CudaDType + DeviceRepr>(
        &self,
        dev: &CudaDevice,
        op: &str,
    ) -> Result<Vec<[u64; 3]>> {
        let stream = dev.cuda_stream();
        self.0
            .iter()
            .map(|[k, v, p]| {
                Ok([
                    k.address::<T>(&stream, op)?,
                    v.address::<T>(&stream, op)?,
                    p.address::<u32>(&stream, op)?,
                ])
            })
            .collect()
    }
}

/// The view of an optional contiguous input, or of `fallback` in its slot when there is none:
/// the kernel never reads the slot then (its `has_*` flag is 0), but it must hold a valid
/// pointer.
pub(crate) fn view_or<'a, T: CudaDType + DeviceRepr>(
    input: &'a Option<Held>,
    fallback: &'a Held,
    op: &str,
) -> Result<CudaView<'a, T>> {
    input.as_ref().unwrap_or(fallback).view(op)
}

/// Wraps a freshly written device buffer as a contiguous tensor.
pub(crate) fn tensor<T: CudaDType>(
    slice: CudaSlice<T>,
    dev: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(slice, dev.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}
