//! Metal host side shared by every op: one run-time-compiled library per shader source and
//! device, pipelines cached by name, buffer access for contiguous tensors, output wrapping,
//! and the one place a kernel is encoded (and counted).
//!
//! Only the binding of buffers and the launch geometry live in the ops' `metal.rs`; what the
//! kernels compute is checked on Linux by compiling the same `.metal` sources as C++
//! (`kernels/emu/`).

use crate::launches;
use anyhow::{anyhow, bail, ensure, Result};
use candle_core::op::BackpropOp;
use candle_core::{DType, MetalDevice, MetalStorage, Shape, Storage, Tensor};
use candle_metal_kernels::metal::{Buffer, ComputePipeline, Library};
use objc2_metal::{MTLCompileOptions, MTLSize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A shipped shader source: the same bytes the emulation tests compile as C++, with the
/// parameter headers it includes (`#include "params/<op>.h"`), which are pasted in place
/// before the run-time compiler sees it (it has no include path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// Path from the workspace root, for messages.
    pub file: &'static str,
    pub text: &'static str,
    /// `(include path as written, header text)`.
    pub headers: &'static [(&'static str, &'static str)],
}

impl KernelSource {
    /// The source with every listed `#include "…"` replaced by its header.
    pub fn expanded(&self) -> Result<String> {
        let mut out = String::with_capacity(self.text.len());
        for line in self.text.lines() {
            let included = line
                .trim()
                .strip_prefix("#include \"")
                .and_then(|rest| rest.strip_suffix('"'));
            match included {
                Some(path) => {
                    let (_, header) = self
                        .headers
                        .iter()
                        .find(|(p, _)| *p == path)
                        .ok_or_else(|| anyhow!("{}: no text for #include \"{path}\"", self.file))?;
                    out.push_str(header);
                }
                None => out.push_str(line),
            }
            out.push('\n');
        }
        Ok(out)
    }
}

/// The [`KernelSource`] of a shipped shader, `kernels/<kernel>` with the parameter header
/// `kernels/<params>` it includes, both embedded at compile time:
/// `metal_source!("attn_prep.metal", "params/attn_prep.h")`.
macro_rules! metal_source {
    ($kernel:literal, $params:literal) => {
        $crate::backend::metal::KernelSource {
            file: concat!("kernels/", $kernel),
            text: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../kernels/",
                $kernel
            )),
            headers: &[(
                $params,
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../kernels/",
                    $params
                )),
            )],
        }
    };
}
pub(crate) use metal_source;

struct CompiledSource {
    library: Library,
    pipelines: HashMap<String, ComputePipeline>,
}

type Cache = HashMap<(u64, &'static str), CompiledSource>;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles `source` for `dev` unless already compiled; runs `f` on its cache entry.
fn with_library<R>(
    dev: &MetalDevice,
    source: &KernelSource,
    f: impl FnOnce(&mut CompiledSource) -> Result<R>,
) -> Result<R> {
    let mut cache = cache()
        .lock()
        .map_err(|_| anyhow!("Metal pipeline cache poisoned"))?;
    let key = (dev.device().registry_id(), source.file);
    if !cache.contains_key(&key) {
        // No language version is pinned: the compiler's default is the newest the OS has, so
        // the library also builds on macOS 13 (MSL 3.0), without the bfloat entry points
        // (`#if defined(__HAVE_BFLOAT__)` in the sources, as candle's shaders do).
        let options = MTLCompileOptions::new();
        let library = dev
            .device()
            .new_library_with_source(&source.expanded()?, Some(&options))
            .map_err(|e| anyhow!("compiling {}: {e}", source.file))?;
        cache.insert(
            key,
            CompiledSource {
                library,
                pipelines: HashMap::new(),
            },
        );
    }
    f(cache.get_mut(&key).expect("inserted above"))
}

/// The pipeline of kernel `name` in `source`, compiling the source on first use per device.
pub(crate) fn pipeline(
    dev: &MetalDevice,
    source: &KernelSource,
    name: &str,
) -> Result<ComputePipeline> {
    with_library(dev, source, |entry| {
        if let Some(p) = entry.pipelines.get(name) {
            return Ok(p.clone());
        }
        let function = entry.library.get_function(name, None).map_err(|e| {
            if name.contains("bf16") {
                anyhow!("kernel {name}: bf16 needs Metal 3.1 (macOS 14 or later); use --dtype f16 ({e})")
            } else {
                anyhow!("kernel {name}: {e}")
            }
        })?;
        let p = dev
            .device()
            .new_compute_pipeline_state_with_function(&function)
            .map_err(|e| anyhow!("pipeline {name}: {e}"))?;
        entry.pipelines.insert(name.to_string(), p.clone());
        Ok(p)
    })
}

/// Whether `source`, compiled for `dev` (once; later calls reuse it), has the entry point
/// `name`: how `capability.rs` asks for what the shader compiler may lack.
pub fn has_function(dev: &MetalDevice, source: &KernelSource, name: &str) -> Result<bool> {
    with_library(dev, source, |entry| {
        Ok(entry.library.get_function(name, None).is_ok())
    })
}

/// A contiguous Metal tensor's buffer and byte offset.
pub(crate) fn metal_buffer(t: &Tensor, op: &str) -> Result<(Buffer, usize)> {
    let buffer = metal_buffer_of_view(t, op)?;
    ensure!(t.is_contiguous(), "{op}: inputs must be contiguous");
    Ok(buffer)
}

/// The buffers and byte offsets of contiguous Metal tensors, in order.
pub(crate) fn metal_buffers<const N: usize>(
    tensors: [&Tensor; N],
    op: &str,
) -> Result<[(Buffer, usize); N]> {
    let mut buffers = Vec::with_capacity(N);
    for t in tensors {
        buffers.push(metal_buffer(t, op)?);
    }
    Ok(buffers
        .try_into()
        .unwrap_or_else(|_| unreachable!("one buffer per tensor")))
}

/// The buffer of an optional contiguous input, or `fallback` in its slot when there is none:
/// the kernel never reads the slot then (its `has_*` flag is 0), but it must hold a buffer.
pub(crate) fn metal_buffer_or(
    input: Option<&Tensor>,
    fallback: &(Buffer, usize),
    op: &str,
) -> Result<(Buffer, usize)> {
    match input {
        Some(t) => metal_buffer(t, op),
        None => Ok(fallback.clone()),
    }
}

/// The Metal device a tensor lives on.
pub(crate) fn metal_device(t: &Tensor, op: &str) -> Result<MetalDevice> {
    match t.device() {
        candle_core::Device::Metal(d) => Ok(d.clone()),
        other => bail!("{op}: expected a Metal tensor, got {other:?}"),
    }
}

/// Operations candle encodes into one command buffer before committing it, unless the user
/// set `CANDLE_METAL_COMPUTE_PER_BUFFER`: above the launches of one decoded token (about 500
/// for Qwen3-Next-80B-A3B, docs/metal.md), so that a token is one command buffer, committed
/// at the host sync that reads its logits, instead of candle's default of one every 50. The
/// binary sets the variable (candle reads it when it creates a device's command queue) at
/// start-up: this crate reads no environment.
pub const COMPUTE_PER_BUFFER: usize = 1000;

/// A fresh buffer of `len` elements of `dtype` for a kernel to write.
pub(crate) fn new_output(
    dev: &MetalDevice,
    len: usize,
    dtype: DType,
    label: &str,
) -> Result<Arc<Buffer>> {
    dev.new_buffer(len, dtype, label)
        .map_err(|e| anyhow!("allocating {label}: {e}"))
}

/// A buffer bound from its start: how a fresh output ([`new_output`]) takes its slot.
pub(crate) fn from_start(buffer: &Buffer) -> (Buffer, usize) {
    (buffer.clone(), 0)
}

/// A grid or threadgroup size: `width × height × depth`.
pub(crate) fn size(width: usize, height: usize, depth: usize) -> MTLSize {
    MTLSize {
        width,
        height,
        depth,
    }
}

/// Wraps a buffer a kernel wrote as a contiguous tensor.
pub(crate) fn output(
    dev: &MetalDevice,
    buffer: Arc<Buffer>,
    shape: impl Into<Shape>,
    dtype: DType,
) -> Tensor {
    let shape = shape.into();
    let storage = MetalStorage::new(buffer, dev.clone(), shape.elem_count(), dtype);
    Tensor::from_storage(Storage::Metal(storage), shape, BackpropOp::none(), false)
}

/// How a kernel uses a bound buffer: candle's encoder tracks hazards from this.
pub(crate) enum Binding<'a> {
    Read(&'a (Buffer, usize)),
    /// Written (or read and written in place): later readers wait for it.
    Write(&'a (Buffer, usize)),
}

/// The bindings of a kernel that reads `reads` from slots `0..` and writes `writes` (its
/// outputs, and buffers it updates in place) in the slots after them.
pub(crate) fn reads_then_writes<'a>(
    reads: &[&'a (Buffer, usize)],
    writes: &[&'a (Buffer, usize)],
) -> Vec<Binding<'a>> {
    let reads = reads.iter().map(|b| Binding::Read(b));
    reads
        .chain(writes.iter().map(|b| Binding::Write(b)))
        .collect()
}

/// One kernel launch: buffers bound to slots `0..`, the parameters (`set_bytes`) in the slot
/// after them, and optional threadgroup memory at index 0. Every Metal launch of this crate
/// goes through here, so this is where launches are counted and, when profiling, their
/// geometry noted ([`crate::profile::record::note_grid`]).
pub(crate) fn encode<P>(
    dev: &MetalDevice,
    pipeline: &ComputePipeline,
    buffers: &[Binding],
    params: &P,
    groups: MTLSize,
    threads: MTLSize,
    threadgroup_bytes: usize,
) -> Result<()> {
    launches::record(1);
    crate::profile::record::note_grid(
        [groups.width, groups.height, groups.depth].map(|n| n as u32),
        [threads.width, threads.height, threads.depth].map(|n| n as u32),
    );
    let guard = dev.command_encoder()?;
    let encoder: &candle_metal_kernels::metal::ComputeCommandEncoder = guard.as_ref();
    encoder.set_compute_pipeline_state(pipeline);
    for (slot, binding) in buffers.iter().enumerate() {
        match binding {
            Binding::Read((buf, offset)) => encoder.set_input_buffer(slot, Some(buf), *offset),
            Binding::Write((buf, offset)) => encoder.set_output_buffer(slot, Some(buf), *offset),
        }
    }
    encoder.set_bytes(buffers.len(), params);
    if threadgroup_bytes > 0 {
        encoder.set_threadgroup_memory_length(0, threadgroup_bytes);
    }
    encoder.dispatch_thread_groups(groups, threads);
    Ok(())
}

/// A tensor's buffer and the byte offset of its first element, whatever its layout: for
/// views whose layout the caller has checked with [`super::row_layout`].
pub(crate) fn metal_buffer_of_view(t: &Tensor, op: &str) -> Result<(Buffer, usize)> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Metal(m) = &*storage else {
        bail!("{op}: expected a Metal tensor")
    };
    Ok((
        m.buffer().clone(),
        layout.start_offset() * t.dtype().size_in_bytes(),
    ))
}
