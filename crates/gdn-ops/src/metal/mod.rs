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
use objc2_metal::{MTLCompileOptions, MTLLanguageVersion};
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

/// The pipeline of kernel `name` in `source`, compiling the source on first use per device.
pub(crate) fn pipeline(
    dev: &MetalDevice,
    source: KernelSource,
    name: &str,
) -> Result<ComputePipeline> {
    let mut cache = cache()
        .lock()
        .map_err(|_| anyhow!("Metal pipeline cache poisoned"))?;
    let key = (dev.device().registry_id(), source);
    if !cache.contains_key(&key) {
        let options = MTLCompileOptions::new();
        // bfloat needs MSL 3.1 (macOS 14).
        options.setLanguageVersion(MTLLanguageVersion::Version3_1);
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
    let entry = cache.get_mut(&key).expect("inserted above");
    if let Some(p) = entry.pipelines.get(name) {
        return Ok(p.clone());
    }
    let function = entry
        .library
        .get_function(name, None)
        .map_err(|e| anyhow!("kernel {name}: {e}"))?;
    let p = dev
        .device()
        .new_compute_pipeline_state_with_function(&function)
        .map_err(|e| anyhow!("pipeline {name}: {e}"))?;
    entry.pipelines.insert(name.to_string(), p.clone());
    Ok(p)
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
