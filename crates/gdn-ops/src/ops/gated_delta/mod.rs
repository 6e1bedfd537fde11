//! The fused gated-delta recurrence of Gated DeltaNet layers: the spec (dims, input checks)
//! and the dispatch to the CPU reference, the Metal kernel (`kernels/gated_delta.metal`) and
//! the CUDA kernel (`kernels/gated_delta.cu`).
//!
//! A call runs in one of two forms ([`GdnForm`]): token by token (the reference, decode and
//! short calls) or in chunks of [`CHUNK`] tokens as matrix products (prefill), where the
//! device has the chunked form ([`chunked_supported_on`]). Both compute the same update; only
//! the order of the f32 sums differs.

pub(crate) mod cpu;
pub(crate) mod cpu_chunked;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::kernel_instance;
use crate::launches;
use crate::profile::{self, elems_bytes, Traffic};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

pub use cpu_chunked::CHUNK;

/// How a call walks its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdnForm {
    /// One token after the other: the reference, and what decode runs.
    Recurrent,
    /// Chunks of [`CHUNK`] tokens as matrix products (the WY form); a last partial chunk
    /// runs through the same code with fewer rows.
    Chunked,
}

/// The shortest call the chunked form takes by default. Below it the chunk form's fixed
/// costs (the triangular system, the state transposed in and out) outweigh its faster
/// products; measured with `scripts/bench-gdn-prefill` (docs/perf-notes.md).
pub const CHUNKED_MIN_STEPS: usize = 16;

impl GdnForm {
    /// The form a switch's text names (`recurrent` or `chunked`, the caller's
    /// `QWEN_GDN_GDN_PREFILL`), if any.
    pub fn from_env_value(value: &str) -> Option<Self> {
        match value {
            "recurrent" => Some(Self::Recurrent),
            "chunked" => Some(Self::Chunked),
            _ => None,
        }
    }

    /// The form a call of `steps` tokens takes when none is forced.
    pub fn by_length(steps: usize) -> Self {
        if steps >= CHUNKED_MIN_STEPS {
            Self::Chunked
        } else {
            Self::Recurrent
        }
    }
}

/// Whether `device` has a chunked form at all. The hook the device backends extend when
/// their chunk kernels land; until then their calls run the recurrence without a notice.
pub fn chunked_available_on(device: &Device) -> bool {
    match device {
        Device::Cpu => true,
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => true,
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => true,
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// The shortest call the CUDA chunk kernels take without being asked: standalone on the H100
/// the three passes beat the recurrence kernel from 512 tokens on (`scripts/gpu/bench-chunk.sh`,
/// docs/perf-notes-gpu.md), and as the Rust host launches them they pass
/// `cuda_gated_delta_chunk` there.
pub const CUDA_CHUNKED_MIN_STEPS: usize = 512;

/// Whether a call of `steps` tokens that the length sends to the chunked form takes it without
/// being asked. The CPU's chunk form is faster from 16 tokens on; the CUDA one from
/// [`CUDA_CHUNKED_MIN_STEPS`]; the Metal one has not run on a Mac yet and is taken only when
/// asked (`QWEN_GDN_GDN_PREFILL=chunked`).
pub fn chunked_by_default_on(device: &Device, steps: usize) -> bool {
    match device {
        Device::Cpu => true,
        Device::Cuda(_) => steps >= CUDA_CHUNKED_MIN_STEPS,
        _ => false,
    }
}

/// Whether the recurrence (`gated_delta_update`) runs on `device` itself for these dims:
/// on CUDA, dims no kernel covers run on the host (a read-back and an upload of the state),
/// which a captured CUDA graph cannot hold.
pub fn runs_on_device(device: &Device, dims: &GdnDims) -> bool {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::supports(dims),
        _ => {
            let _ = dims;
            true
        }
    }
}

/// Whether `device` has the chunked form for these dims. The CPU takes any dims (its buffers
/// are padded to whole tiles); a device backend whose kernels cover fewer narrows this.
pub fn chunked_supported_on(device: &Device, dims: &GdnDims) -> bool {
    match device {
        Device::Cpu => true,
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => metal_chunked::supports(dims),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda_chunked::supports(dims),
        #[allow(unreachable_patterns)]
        _ => {
            let _ = dims;
            false
        }
    }
}

/// The read-only inputs of one call, as the device backends receive them.
pub(crate) struct Inputs<'a> {
    pub(crate) q: &'a Tensor,
    pub(crate) k: &'a Tensor,
    pub(crate) v: &'a Tensor,
    pub(crate) g: &'a Tensor,
    pub(crate) beta: &'a Tensor,
    pub(crate) mask: Option<&'a Tensor>,
}

impl<'a> Inputs<'a> {
    pub(crate) fn new(
        q: &'a Tensor,
        k: &'a Tensor,
        v: &'a Tensor,
        g: &'a Tensor,
        beta: &'a Tensor,
        mask: Option<&'a Tensor>,
    ) -> Self {
        Self {
            q,
            k,
            v,
            g,
            beta,
            mask,
        }
    }
}

/// A call's inputs in the layouts and dtypes every GPU kernel of this op reads (the Metal and
/// CUDA recurrence and chunk kernels alike): q, k and v contiguous in q's dtype (InT), g, beta
/// and the mask contiguous in f32. On Metal it is made before the encoder is taken: candle's
/// ops lock the same command state.
#[cfg(any(feature = "metal", target_os = "macos", feature = "cuda"))]
pub(crate) struct Prepared {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    pub(crate) g: Tensor,
    pub(crate) beta: Tensor,
    pub(crate) mask: Option<Tensor>,
}

#[cfg(any(feature = "metal", target_os = "macos", feature = "cuda"))]
impl Inputs<'_> {
    pub(crate) fn prepare(&self) -> Result<Prepared> {
        let in_dtype = self.q.dtype();
        let f32_contiguous = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
        Ok(Prepared {
            q: self.q.contiguous()?,
            k: self.k.to_dtype(in_dtype)?.contiguous()?,
            v: self.v.to_dtype(in_dtype)?.contiguous()?,
            g: f32_contiguous(self.g)?,
            beta: f32_contiguous(self.beta)?,
            mask: self.mask.map(f32_contiguous).transpose()?,
        })
    }
}

/// `GdnParams` of kernels/params/gated_delta.h, field for field: the Metal kernel's
/// parameters, and the CUDA kernel's trailing scalar arguments in the same order.
#[cfg(any(feature = "metal", target_os = "macos", feature = "cuda"))]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GdnParams {
    batch: u32,
    steps: u32,
    key_heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    has_mask: u32,
}

#[cfg(any(feature = "metal", target_os = "macos", feature = "cuda"))]
impl GdnParams {
    fn new(dims: &GdnDims, has_mask: bool) -> Self {
        Self {
            batch: dims.batch as u32,
            steps: dims.steps as u32,
            key_heads: dims.key_heads as u32,
            value_heads: dims.value_heads as u32,
            key_dim: dims.key_dim as u32,
            value_dim: dims.value_dim as u32,
            has_mask: has_mask as u32,
        }
    }
}

/// The recurrence kernel's instantiation (`kernels/gated_delta.{metal,cu}`) for activations
/// of `input` and a state of `state` dtype.
pub fn kernel_name(input: DType, state: DType) -> Result<String> {
    const OP: &str = "gated_delta_update";
    ensure_state_dtype(state, OP)?;
    kernel_instance("gated_delta_step", &[input, state], OP)
}

/// Fails unless the state is kept in a dtype the GPU kernels take: f32 or bf16.
fn ensure_state_dtype(state: DType, op: &str) -> Result<()> {
    ensure!(
        matches!(state, DType::F32 | DType::BF16),
        "{op}: the state must be f32 or bf16"
    );
    Ok(())
}

/// Shapes of one gated-delta call, read off its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    pub batch: usize,
    pub steps: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

impl GdnDims {
    /// The dims of a call, after checking that its inputs agree (also used by the fused
    /// recurrence and norm, `ops::gated_delta_norm`).
    pub(crate) fn of(inputs: &Inputs, state: &Tensor) -> Result<Self> {
        let Inputs {
            q, k, v, g, beta, ..
        } = *inputs;
        let (batch, steps, key_heads, key_dim) = q.dims4()?;
        let (_, _, value_heads, value_dim) = v.dims4()?;
        let d = Self {
            batch,
            steps,
            key_heads,
            value_heads,
            key_dim,
            value_dim,
        };
        ensure!(
            k.dims() == q.dims(),
            "gated_delta_update: k {:?} must match q {:?}",
            k.dims(),
            q.dims()
        );
        ensure!(
            v.dims()[..2] == [batch, steps],
            "gated_delta_update: v {:?} does not match q {:?}",
            v.dims(),
            q.dims()
        );
        ensure!(
            value_heads % key_heads == 0,
            "gated_delta_update: {value_heads} value heads not a multiple of {key_heads} key heads"
        );
        for (name, t) in [("g", g), ("beta", beta)] {
            ensure!(
                t.dims() == [batch, steps, value_heads],
                "gated_delta_update: {name} {:?}, expected {:?}",
                t.dims(),
                [batch, steps, value_heads]
            );
        }
        ensure!(
            state.dims() == [batch, value_heads, value_dim, key_dim],
            "gated_delta_update: state {:?}, expected {:?}",
            state.dims(),
            [batch, value_heads, value_dim, key_dim]
        );
        Ok(d)
    }
}

/// Advances `state` `[B, Hv, Dv, Dk]` in place over `T` tokens and returns `y`
/// `[B, T, Hv, Dv]` in q's dtype.
///
/// Inputs: `q`, `k` `[B, T, Hk, Dk]` (already L2-normalised, q scaled by 1/√Dk), `v`
/// `[B, T, Hv, Dv]`, decay `g` and `beta` `[B, T, Hv]`. Value head `hv` uses key head
/// `hv / (Hv / Hk)`. Per token, in mlx-lm's order: `S ← g·S`; `kv = S·k`;
/// `δ = (v − kv)·β`; `S ← S + δ⊗k`; `y = S·q`. Arithmetic is f32; the state is read
/// once and written once per call in its own dtype (f32, or bf16 when opted in).
pub fn gated_delta_update(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
) -> Result<Tensor> {
    gated_delta_update_masked(q, k, v, g, beta, state, None)
}

/// As [`gated_delta_update`], with an optional `[B, T]` mask for padded batches: where the
/// mask is 0 the state is left untouched and `y` is 0.
pub fn gated_delta_update_masked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let steps = q.dims().get(1).copied().unwrap_or(0);
    update(
        GdnForm::by_length(steps),
        false,
        &Inputs::new(q, k, v, g, beta, mask),
        state,
    )
}

/// As [`gated_delta_update_masked`] in the given form: how the tests compare the two, and how
/// the model runs a form forced by its `QWEN_GDN_GDN_PREFILL`. The
/// chunked form where the device does not have it for these dims falls back to the
/// recurrence with a one-line notice (once per process); so does a call the length sends to
/// the chunked form on a device that has it for other dims only.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update_in(
    form: GdnForm,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    update(form, true, &Inputs::new(q, k, v, g, beta, mask), state)
}

/// One call in `form`; `asked`: the form was asked for (by the caller, or forced by
/// `QWEN_GDN_GDN_PREFILL`), not chosen by length.
fn update(form: GdnForm, asked: bool, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    let dims = GdnDims::of(inputs, state)?;
    if let Some(m) = inputs.mask {
        ensure!(
            m.dims() == [dims.batch, dims.steps],
            "gated_delta_update: mask {:?}, expected {:?}",
            m.dims(),
            [dims.batch, dims.steps]
        );
    }
    let chunked = form == GdnForm::Chunked
        && (asked || chunked_by_default_on(state.device(), dims.steps))
        && {
            let supported = chunked_supported_on(state.device(), &dims);
            if !supported && (asked || chunked_available_on(state.device())) {
                static NOTICED: AtomicBool = AtomicBool::new(false);
                if !NOTICED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                    "qwen-gdn: no chunked gated delta on {:?} for {dims:?}; running the recurrence",
                    state.device().location()
                );
                }
            }
            supported
        };
    let name = if chunked {
        "gated_delta_chunked"
    } else {
        "gated_delta"
    };
    let device = state.device();
    let traffic = || Ok(traffic(inputs, dims, state));
    profile::kernel(name, device, traffic, || match device {
        // Stands in for the one kernel a GPU launches.
        Device::Cpu => {
            launches::record(1);
            if chunked {
                cpu_chunked::gated_delta_update(dims, inputs, state)
            } else {
                cpu::gated_delta_update(dims, inputs, state)
            }
        }
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) if chunked => metal_chunked::gated_delta_update(dims, inputs, state),
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => metal::gated_delta_update(dims, inputs, state),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) if !cuda::supports(&dims) => on_host(dims, inputs, state),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) if chunked => cuda_chunked::gated_delta_update(dims, inputs, state),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::gated_delta_update(dims, inputs, state),
        other => bail!("gated_delta_update: no kernel for device {other:?} yet"),
    })
}

/// Bytes moved (the decode profile), for the recurrence alone and for it with the norm
/// (`ops::gated_delta_norm` adds what the norm reads): q, k, v, g, beta and the mask read;
/// the state read once and written once in its own dtype, whatever the number of tokens; y
/// (`[B, T, Hv, Dv]` in q's dtype) written.
pub(crate) fn traffic(inputs: &Inputs, dims: GdnDims, state: &Tensor) -> Traffic {
    let y = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    let mut t = Traffic::new();
    for x in [inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta]
        .into_iter()
        .chain(inputs.mask)
    {
        t = t.read_all(x);
    }
    t.read_all(state)
        .write_all(state)
        .write(elems_bytes(y, inputs.q.dtype()))
}

/// The recurrence on the host for shapes a GPU kernel does not cover (key head dims of tiny
/// test models): the CPU form reads the inputs wherever they are and builds y on their device;
/// only the state is copied to the host and back (in place, as the kernels update it). Real
/// models never take it; a notice says so once.
#[cfg(feature = "cuda")]
fn on_host(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    static NOTICED: AtomicBool = AtomicBool::new(false);
    if !NOTICED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "qwen-gdn: no gated delta kernel on {:?} for {dims:?}; running it on the host",
            state.device().location()
        );
    }
    let host_state = state.to_device(&Device::Cpu)?;
    let y = cpu::gated_delta_update(dims, inputs, &host_state)?;
    state.slice_set(&host_state.to_device(state.device())?, 0, 0)?;
    Ok(y)
}

// ---- Chunked prefill on the GPUs: kernels/gated_delta_chunk.{metal,cu} -------------------
// (metal_chunked.rs, cuda_chunked.rs, and their shared chunk/tail split in chunked.rs.)

#[cfg(any(feature = "metal", target_os = "macos", feature = "cuda"))]
mod chunked;
#[cfg(feature = "cuda")]
pub mod cuda_chunked;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal_chunked;

/// As [`gated_delta_update_masked`], always in the chunked (WY/UT) form where the device has
/// it for these dims (on the GPUs: full chunks of 64 tokens as matrix products, the tail
/// through the recurrence kernel), else the recurrence with a one-line notice.
pub fn gated_delta_update_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    gated_delta_update_in(GdnForm::Chunked, q, k, v, g, beta, state, mask)
}
