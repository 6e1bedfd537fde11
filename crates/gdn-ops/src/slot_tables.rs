//! The slot kernels' tables of addresses (`*_slots` ops: each sequence's state, KV buffers and
//! position read through a table), uploaded once per content and reused by every later call
//! that needs the same table, so that a batched decode step in steady state uploads none.
//!
//! A table's words (device addresses, capacities, key ranges) are its key: a table is
//! uploaded again exactly when a word changes, i.e. when
//! - a sequence joins or leaves the batch (the rows change),
//! - a buffer is reallocated (a KV buffer growing, a cache replaced: its address changes),
//! - a capacity grows (with its buffer, and with it the key ranges of the decode's split).
//!
//! Since a table holds nothing but its words, one whose words match is the right table
//! whatever buffers stood at those addresses before; there is no stale entry to invalidate.
//! The cache is bounded ([`CAPACITY`], least recently used out first); [`clear`] frees every
//! table now (the end of a batch, a test). Each thread keeps its own (the decode loop runs on
//! one). The CPU twins look up the same way with the host addresses of the same tensors
//! ([`host_table`]), so that the uploads counted on the CPU are the GPU's.

use anyhow::{bail, Result};
use candle_core::{CpuStorage, Storage, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;

/// Whether `device` has the slot kernels, every slot op's answer (the dims and dtypes are
/// each per-sequence op's, e.g. [`crate::ops::gated_delta_norm::supports`]).
pub fn supports_device(device: &candle_core::Device) -> bool {
    match device {
        candle_core::Device::Cpu => true,
        candle_core::Device::Cuda(_) => cfg!(feature = "cuda"),
        // No Metal kernels yet: a table of addresses needs argument buffers or `gpuAddress`
        // with residency and hazards declared by hand (docs/perf-notes.md).
        candle_core::Device::Metal(_) => false,
    }
}

/// Most tables kept per thread: a step of Qwen3-Next-80B-A3B uses 96 (two a layer), so a few
/// batch compositions fit.
pub const CAPACITY: usize = 1024;

/// Tables by their words, each with the clock of its last use.
pub(crate) struct Tables<V> {
    entries: HashMap<Vec<u64>, (V, u64)>,
    clock: u64,
}

impl<V> Default for Tables<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            clock: 0,
        }
    }
}

impl<V: Clone> Tables<V> {
    /// The table of `words`, made by `upload` (and counted, [`crate::launches::upload`]) only
    /// when no table of these words is kept.
    pub(crate) fn get_or_upload(
        &mut self,
        words: &[u64],
        upload: impl FnOnce(&[u64]) -> Result<V>,
    ) -> Result<V> {
        self.clock += 1;
        if let Some((table, used)) = self.entries.get_mut(words) {
            *used = self.clock;
            return Ok(table.clone());
        }
        let table = upload(words)?;
        crate::launches::upload(1);
        if self.entries.len() >= CAPACITY {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.entries
            .insert(words.to_vec(), (table.clone(), self.clock));
        Ok(table)
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

thread_local! {
    static HOST: RefCell<Tables<()>> = RefCell::new(Tables::default());
}

#[cfg(feature = "cuda")]
thread_local! {
    /// The CUDA slot launchers' tables on the device (`backend::cuda::slot_table`), kept here
    /// beside the host's so that [`clear`] and [`kept`] cover both.
    pub(crate) static DEVICE: RefCell<
        Tables<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaSlice<u64>>>,
    > = RefCell::new(Tables::default());
}

/// The device tables handed out while a [`keeping`] call runs, held by its [`Kept`].
#[cfg(feature = "cuda")]
thread_local! {
    static KEEPING: RefCell<Option<Vec<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaSlice<u64>>>>> =
        const { RefCell::new(None) };
}

/// Tables kept alive past the cache's own hold (see [`keeping`]).
#[derive(Default)]
pub struct Kept {
    #[cfg(feature = "cuda")]
    _tables: Vec<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaSlice<u64>>>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept").finish_non_exhaustive()
    }
}

/// Runs `f` and returns, with its result, every device table a slot op of `f` was handed
/// (uploaded or found kept). A captured CUDA graph reads its slot launches' tables on every
/// replay, long after the launch that looked them up: holding them keeps them from being
/// freed when this thread's cache drops them (least recently used, or [`clear`]).
pub fn keeping<R>(f: impl FnOnce() -> R) -> (R, Kept) {
    #[cfg(feature = "cuda")]
    {
        let outer = KEEPING.with(|k| k.borrow_mut().replace(Vec::new()));
        let r = f();
        let tables = KEEPING.with(|k| std::mem::replace(&mut *k.borrow_mut(), outer));
        (
            r,
            Kept {
                _tables: tables.unwrap_or_default(),
            },
        )
    }
    #[cfg(not(feature = "cuda"))]
    (f(), Kept::default())
}

/// Notes a device table handed to a slot launch (for [`keeping`]).
#[cfg(feature = "cuda")]
pub(crate) fn handed_out(
    table: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaSlice<u64>>,
) {
    KEEPING.with(|k| {
        if let Some(kept) = k.borrow_mut().as_mut() {
            kept.push(table.clone());
        }
    });
}

/// Frees every table this thread keeps (the next call of each slot op uploads its table).
pub fn clear() {
    HOST.with(|t| t.borrow_mut().clear());
    #[cfg(feature = "cuda")]
    DEVICE.with(|t| t.borrow_mut().clear());
}

/// Tables this thread keeps, on every backend.
pub fn kept() -> usize {
    let kept = HOST.with(|t| t.borrow().len());
    #[cfg(feature = "cuda")]
    let kept = kept + DEVICE.with(|t| t.borrow().len());
    kept
}

/// A CPU twin's stand-in for its kernel's table: `words` built from [`host_address`]es as the
/// kernel's from device addresses; counts an upload when no table of these words is kept.
pub(crate) fn host_table(words: &[u64]) -> Result<()> {
    HOST.with(|t| t.borrow_mut().get_or_upload(words, |_| Ok(())))
}

/// The host address of a CPU tensor's first element.
pub(crate) fn host_address(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(s) = &*storage else {
        bail!("slot table: expected a CPU tensor")
    };
    let base = match s {
        CpuStorage::U8(v) => v.as_ptr() as u64,
        CpuStorage::U32(v) => v.as_ptr() as u64,
        CpuStorage::BF16(v) => v.as_ptr() as u64,
        CpuStorage::F16(v) => v.as_ptr() as u64,
        CpuStorage::F32(v) => v.as_ptr() as u64,
        _ => bail!("slot table: no slot op takes {:?}", t.dtype()),
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}

/// A CPU slot twin: the table lookup its kernel's launch would make (`words`, see
/// [`host_table`]), then one launch ([`crate::launches::cpu_twin`]).
pub(crate) fn cpu_slot_twin<R>(words: &[u64], f: impl FnOnce() -> Result<R>) -> Result<R> {
    host_table(words)?;
    crate::launches::cpu_twin(f)
}

/// The host words of a table of one address a row: `tensors`' host addresses.
pub(crate) fn host_words(tensors: &[Tensor]) -> Result<Vec<u64>> {
    tensors.iter().map(host_address).collect()
}

/// The host words of a table of each sequence's KV buffers and position, and its capacity
/// (`attn_prep_slots`, `attn_decode_slots`).
pub(crate) fn host_kv_words(rows: &[(&Tensor, &Tensor, &Tensor, usize)]) -> Result<Vec<u64>> {
    let mut words = Vec::with_capacity(4 * rows.len());
    for &(keys, values, pos, capacity) in rows {
        words.extend([
            host_address(keys)?,
            host_address(values)?,
            host_address(pos)?,
            capacity as u64,
        ]);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_uploaded_once_per_content_and_the_oldest_goes_first() {
        let mut tables = Tables::<u32>::default();
        let made = std::cell::Cell::new(0);
        let get = |tables: &mut Tables<u32>, words: &[u64]| {
            tables
                .get_or_upload(words, |w| {
                    made.set(made.get() + 1);
                    Ok(w[0] as u32)
                })
                .unwrap()
        };
        assert_eq!(get(&mut tables, &[1, 2]), 1);
        assert_eq!(get(&mut tables, &[1, 2]), 1);
        assert_eq!(get(&mut tables, &[1, 3]), 1);
        for i in 0..CAPACITY as u64 {
            get(&mut tables, &[10 + i]);
        }
        assert_eq!(tables.len(), CAPACITY);
        // [1, 2] and [1, 3] were the least recently used: both gone.
        assert!(!tables.entries.contains_key(&vec![1, 2]));
        assert!(!tables.entries.contains_key(&vec![1, 3]));
        assert_eq!(made.get(), 2 + CAPACITY);
    }
}
