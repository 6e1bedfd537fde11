//! Metal host side of the kernels in `kernels/`: one run-time-compiled library per shader
//! source and device, pipelines cached by name, and buffer access for contiguous tensors.
//!
//! Only the binding of buffers and the launch geometry live here; what the kernels compute is
//! checked on Linux by compiling the same `.metal` sources as C++ (`kernels/emu/`).

pub mod affine;
pub mod gated_delta;

pub(crate) use gated_delta::gated_delta_update;

use anyhow::{anyhow, bail, ensure, Result};
use candle_core::{MetalDevice, Storage, Tensor};
use candle_metal_kernels::metal::{Buffer, ComputePipeline, Library};
use objc2_metal::MTLCompileOptions;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A shipped shader source: the same bytes the emulation tests compile as C++.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSource {
    GatedDelta,
    Affine,
}

impl KernelSource {
    pub fn text(self) -> &'static str {
        match self {
            Self::GatedDelta => include_str!("../../../../kernels/gated_delta.metal"),
            Self::Affine => include_str!("../../../../kernels/affine.metal"),
        }
    }

    fn file(self) -> &'static str {
        match self {
            Self::GatedDelta => "kernels/gated_delta.metal",
            Self::Affine => "kernels/affine.metal",
        }
    }
}

struct CompiledSource {
    library: Library,
    pipelines: HashMap<String, ComputePipeline>,
}

type Cache = HashMap<(u64, KernelSource), CompiledSource>;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles `source` for `dev` unless already compiled; runs `f` on its cache entry.
fn with_library<R>(
    dev: &MetalDevice,
    source: KernelSource,
    f: impl FnOnce(&mut CompiledSource) -> Result<R>,
) -> Result<R> {
    let mut cache = cache()
        .lock()
        .map_err(|_| anyhow!("Metal pipeline cache poisoned"))?;
    let key = (dev.device().registry_id(), source);
    if !cache.contains_key(&key) {
        // No language version is pinned: the compiler's default is the newest the OS has, so
        // the library also builds on macOS 13 (MSL 3.0), without the bfloat entry points
        // (`#if defined(__HAVE_BFLOAT__)` in the sources, as candle's shaders do).
        let options = MTLCompileOptions::new();
        let library = dev
            .device()
            .new_library_with_source(source.text(), Some(&options))
            .map_err(|e| anyhow!("compiling {}: {e}", source.file()))?;
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
    source: KernelSource,
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

/// Whether this device's shader compiler has `bfloat` (MSL 3.1, macOS 14): compiles our
/// affine library, if not yet, and looks for one of its bfloat entry points.
pub fn bf16_supported(dev: &MetalDevice) -> Result<bool> {
    with_library(dev, KernelSource::Affine, |entry| {
        Ok(entry
            .library
            .get_function("affine_qmv_bf16_bf16", None)
            .is_ok())
    })
}

/// Compiles both shader libraries and the pipelines of every kernel the device plan may
/// launch with `activation` inputs, so that no compilation lands in a timed forward call.
pub fn precompile(dev: &MetalDevice, activation: candle_core::DType) -> Result<()> {
    let with_bf16 = bf16_supported(dev)?;
    let tag = |d: candle_core::DType| match d {
        candle_core::DType::F16 => "f16",
        candle_core::DType::BF16 => "bf16",
        _ => "f32",
    };
    let act = tag(activation);
    for scale in ["f32", "f16", "bf16"] {
        if scale == "bf16" && !with_bf16 {
            continue;
        }
        pipeline(
            dev,
            KernelSource::Affine,
            &format!("affine_qmv_{act}_{scale}"),
        )?;
        pipeline(
            dev,
            KernelSource::Affine,
            &format!("affine_dequant_{act}_{scale}"),
        )?;
    }
    for state in ["f32", "bf16"] {
        if state == "bf16" && !with_bf16 {
            continue;
        }
        pipeline(
            dev,
            KernelSource::GatedDelta,
            &format!("gated_delta_step_{act}_{state}"),
        )?;
    }
    Ok(())
}

/// A contiguous Metal tensor's buffer and byte offset.
pub(crate) fn metal_buffer(t: &Tensor, op: &str) -> Result<(Buffer, usize)> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Metal(m) = &*storage else {
        bail!("{op}: expected a Metal tensor")
    };
    ensure!(layout.is_contiguous(), "{op}: inputs must be contiguous");
    Ok((
        m.buffer().clone(),
        layout.start_offset() * t.dtype().size_in_bytes(),
    ))
}

/// The Metal device a tensor lives on.
pub(crate) fn metal_device(t: &Tensor, op: &str) -> Result<MetalDevice> {
    match t.device() {
        candle_core::Device::Metal(d) => Ok(d.clone()),
        other => bail!("{op}: expected a Metal tensor, got {other:?}"),
    }
}
