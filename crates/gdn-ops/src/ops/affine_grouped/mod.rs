//! Every expert's product of a MoE projection over rows sorted by expert, in one kernel launch
//! where the device has one (`kernels/affine_grouped.cu`), as mlx's `gather_qmm` and vLLM's
//! fused MoE do: the per-expert path costs a dequantization, a matmul and a copy per expert in
//! use, thousands of launches per MoE layer of a prefill chunk.
//!
//! Spec: `x` `[P, cols]` holds rows sorted by expert, expert `e`'s rows being
//! `offsets[e] .. offsets[e + 1]` (`offsets.len() == experts + 1`, `offsets[0] == 0`,
//! non-decreasing, `offsets[experts] == P`). The result `[P, rows]` in x's dtype holds, in row
//! `p` of expert `e`, `x[p] · W_eᵀ`, with `W_e` the MLX affine dequantization rounded once into
//! x's dtype and the sums in f32 (so that f16 and bf16 products run on tensor cores).
//!
//! The CPU twin ([`cpu`], per expert: dequantize, round, multiply in f32) is the
//! reference. Metal runs `kernels/affine_grouped.metal` ([`metal`]) where its
//! `supports` holds, CUDA where [`AffineTensor::supports_grouped_kernel`] holds; the rest runs
//! the per-expert path. [`tiles`] is the Metal kernel's launch contract.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;
pub mod slicing;
pub mod split_k;
pub mod tiles;

use crate::launches;
use crate::ops::affine::AffineTensor;
use crate::profile::{self, elems_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};

/// Pairs per entry of the tile schedule at most: `kTileM` of kernels/affine_grouped.cu, which
/// also takes tiles of 16 and 32 pairs ([`tile_pairs_for`]).
pub const TILE_PAIRS: usize = 64;
/// The tile heights the kernel takes.
pub const TILE_PAIRS_CHOICES: [usize; 3] = [16, 32, TILE_PAIRS];
/// Output rows per block: `kTileN` of kernels/affine_grouped.cu.
pub const TILE_ROWS: usize = 128;
/// Columns per step of the kernel (`kTileK`; the last step of a matrix may hold [`SPAN_COLS`]).
pub const TILE_COLS: usize = 64;
/// Columns one thread dequantizes per step (`kSpan`): cols and the group size are multiples of
/// it, so that a span never crosses a group.
pub const SPAN_COLS: usize = 32;
/// Threads per block: `kThreads` of kernels/affine_grouped.cu.
pub const THREADS: usize = 256;
/// Dynamic shared memory per block in bytes (`kSmemBytes`): two stages of the x tile
/// (`TILE_PAIRS` rows) and the weight tile (`TILE_ROWS` rows), each row `TILE_COLS + 8`
/// 16-bit values (f32 activations: one stage of 4-byte values, the same bytes).
pub const SMEM_BYTES: usize = 2 * (TILE_PAIRS + TILE_ROWS) * (TILE_COLS + 8) * 2;

/// `AffineGroupedParams` of kernels/params/affine_grouped.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineGroupedParams {
    pub rows: u32,
    pub cols: u32,
    pub bits: u32,
    pub group_size: u32,
    pub experts: u32,
    pub pairs: u32,
    pub tiles: u32,
    pub tile_pairs: u32,
    /// Split-K: steps of [`TILE_COLS`] columns per slice (grid z); 0: one slice writing y.
    pub slice_steps: u32,
}

/// The tile height for checked offsets: the smallest of [`TILE_PAIRS_CHOICES`] that holds the
/// mean pairs of the experts with pairs. A short chunk spreads ~10 pairs over each routed
/// expert, where a 64-pair tile would multiply mostly padding; smaller tiles cost more
/// dequantizations of an expert's weights (one per tile), so a long chunk keeps 64.
pub fn tile_pairs_for(offsets: &[u32]) -> usize {
    let used = offsets.windows(2).filter(|s| s[1] > s[0]).count().max(1);
    let pairs = *offsets.last().unwrap_or(&0) as usize;
    let mean = pairs.div_ceil(used);
    TILE_PAIRS_CHOICES
        .into_iter()
        .find(|&t| t >= mean)
        .unwrap_or(TILE_PAIRS)
}

/// The kernel's tile schedule from checked offsets: `(expert, first pair, count)` per tile,
/// flattened; each expert's rows cut into tiles of at most `tile_pairs`, experts without
/// rows left out (no block reads their weights).
pub fn tile_schedule(offsets: &[u32], tile_pairs: usize) -> Vec<u32> {
    expert_tiles(offsets, tile_pairs)
        .flat_map(|(e, first, end)| [e, first, end - first])
        .collect()
}

/// Each expert's rows of checked offsets cut into runs of at most `height` (> 0), experts in
/// order, experts without rows left out: `(expert, first row, end row)` per run. The tile
/// schedules of the CUDA and Metal kernels, which differ in tile height and layout.
pub fn expert_tiles(offsets: &[u32], height: usize) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
    offsets.windows(2).enumerate().flat_map(move |(e, span)| {
        (span[0]..span[1])
            .step_by(height)
            .map(move |first| (e as u32, first, (first + height as u32).min(span[1])))
    })
}

impl AffineTensor {
    /// `x Wₑᵀ` for every expert `e` over its rows `offsets[e] .. offsets[e + 1]` of `x`
    /// `[P, cols]` (rows sorted by expert) → `[P, rows]` in x's dtype (the module's spec).
    pub fn grouped_matmul_t(&self, x: &Tensor, offsets: &[u32]) -> Result<Tensor> {
        let pairs = self.check_grouped(x, offsets)?;
        if pairs == 0 {
            return Ok(Tensor::zeros((0, self.rows), x.dtype(), x.device())?);
        }
        // Bytes moved (the decode profile): x read; the matrices of the experts with rows read
        // once each (a tile rereads its expert from cache at best: counted once); the
        // products written.
        let traffic = || {
            let used = offsets.windows(2).filter(|s| s[1] > s[0]).count();
            Ok(Traffic::new()
                .read_all(x)
                .read(used * self.rows * self.row_bytes())
                .write(elems_bytes(pairs * self.rows, x.dtype())))
        };
        let device = self.device();
        profile::kernel("affine_grouped", device, traffic, || match device {
            Device::Cpu => launches::cpu_twin(|| cpu::grouped_products(self, x, offsets)),
            #[cfg(any(feature = "metal", target_os = "macos"))]
            Device::Metal(_) if metal::supports(self) => metal::grouped_matmul_t(self, x, offsets),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) if self.supports_grouped_kernel(x.dtype()) => {
                cuda::grouped_matmul_t(self, x, offsets)
            }
            // Its products are rows of this one (an op inside another is part of it).
            _ => self.grouped_per_expert(x, offsets),
        })
    }

    /// Whether the grouped kernel covers this matrix and activations of `dtype`: 2, 4 or 8
    /// bits (whole values per packed word), cols and the group size multiples of
    /// [`SPAN_COLS`] (one scale and bias per thread's span), float activations and scales.
    /// The rest runs [`Self::grouped_per_expert`].
    pub fn supports_grouped_kernel(&self, dtype: DType) -> bool {
        matches!(self.bits, 2 | 4 | 8)
            && self.cols.is_multiple_of(SPAN_COLS)
            && self.group_size.is_multiple_of(SPAN_COLS)
            && self.cols.is_multiple_of(self.group_size)
            && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
            && matches!(self.scales.dtype(), DType::F32 | DType::F16 | DType::BF16)
    }

    /// Whether [`Self::grouped_matmul_t`] runs its kernel (or, on the CPU, its twin) for `x`
    /// on this device, rather than the per-expert path: what a caller that is itself the
    /// per-expert path's product ([`Self::matmul_t`]) asks first.
    pub fn has_grouped_kernel(&self, x: &Tensor) -> bool {
        match self.device() {
            Device::Cpu => true,
            #[cfg(any(feature = "metal", target_os = "macos"))]
            Device::Metal(_) => metal::supports(self),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => {
                self.supports_grouped_kernel(x.dtype())
                    && (x.layout().start_offset() * x.dtype().size_in_bytes()).is_multiple_of(16)
            }
            #[allow(unreachable_patterns)]
            _ => {
                let _ = x;
                false
            }
        }
    }

    /// The same products, one expert at a time ([`Self::matmul_t`] on each expert with rows:
    /// a dequantization and a matmul, or the direct products for a few rows), concatenated.
    pub fn grouped_per_expert(&self, x: &Tensor, offsets: &[u32]) -> Result<Tensor> {
        let pairs = self.check_grouped(x, offsets)?;
        if pairs == 0 {
            return Ok(Tensor::zeros((0, self.rows), x.dtype(), x.device())?);
        }
        let mut parts = vec![];
        for (e, span) in offsets.windows(2).enumerate() {
            let (start, len) = (span[0] as usize, (span[1] - span[0]) as usize);
            if len > 0 {
                parts.push(self.expert(e)?.matmul_t(&x.narrow(0, start, len)?)?);
            }
        }
        match parts.len() {
            1 => Ok(parts.pop().expect("one part")),
            n => launches::candle_ops(n, Tensor::cat(&parts, 0)),
        }
    }

    /// The number of pairs, after checking x and the offsets against the matrix.
    fn check_grouped(&self, x: &Tensor, offsets: &[u32]) -> Result<usize> {
        const OP: &str = "grouped matmul";
        ensure!(
            x.rank() == 2 && x.dim(1)? == self.cols,
            "{OP}: input {:?} must be [pairs, {}]",
            x.dims(),
            self.cols
        );
        ensure!(
            x.device().same_device(self.device()),
            "{OP}: input and weights are on different devices"
        );
        let pairs = x.dim(0)?;
        check_offsets(offsets, self.experts, pairs)?;
        Ok(pairs)
    }
}

/// Checks that `offsets` splits `pairs` rows among `experts` experts: `experts + 1` entries,
/// from 0, never decreasing, ending at `pairs`. Every backend's kernel (and its emulation)
/// relies on it.
pub fn check_offsets(offsets: &[u32], experts: usize, pairs: usize) -> Result<()> {
    const OP: &str = "grouped matmul";
    ensure!(
        offsets.len() == experts + 1,
        "{OP}: {} offsets for {experts} experts (expected experts + 1)",
        offsets.len()
    );
    ensure!(
        offsets[0] == 0,
        "{OP}: the offsets start at {}, not 0",
        offsets[0]
    );
    if let Some(e) = offsets.windows(2).position(|s| s[1] < s[0]) {
        anyhow::bail!(
            "{OP}: offsets decrease at expert {e} ({} then {})",
            offsets[e],
            offsets[e + 1]
        );
    }
    ensure!(
        offsets[experts] as usize == pairs,
        "{OP}: the offsets end at {}, but x has {pairs} rows",
        offsets[experts]
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_cuts_each_expert_into_tiles_and_skips_empty_ones() {
        // Expert 0: 0 rows; 1: 1 row; 2: 64 rows; 3: 65 rows; 4: 130 rows.
        let offsets = [0, 0, 1, 65, 130, 260];
        let tiles: Vec<[u32; 3]> = tile_schedule(&offsets, 64)
            .chunks_exact(3)
            .map(|t| [t[0], t[1], t[2]])
            .collect();
        assert_eq!(
            tiles,
            [
                [1, 0, 1],
                [2, 1, 64],
                [3, 65, 64],
                [3, 129, 1],
                [4, 130, 64],
                [4, 194, 64],
                [4, 258, 2]
            ]
        );
        assert!(tile_schedule(&[0, 0, 0], 64).is_empty());
        let small: Vec<u32> = tile_schedule(&[0, 20, 20], 16);
        assert_eq!(small, [0, 0, 16, 0, 16, 4]);
    }

    #[test]
    fn the_tile_height_holds_a_mean_expert() {
        // pp512 of Qwen3-Next: ~10 pairs per routed expert, the shared expert on 512.
        let mut counts = vec![10u32; 512];
        counts.push(512);
        let offsets: Vec<u32> = std::iter::once(0)
            .chain(counts.iter().scan(0, |at, c| {
                *at += c;
                Some(*at)
            }))
            .collect();
        assert_eq!(tile_pairs_for(&offsets), 16);
        assert_eq!(tile_pairs_for(&[0, 0, 30, 60]), 32);
        assert_eq!(tile_pairs_for(&[0, 44, 88]), 64);
        assert_eq!(tile_pairs_for(&[0, 500]), 64);
        assert_eq!(tile_pairs_for(&[0, 0]), 16);
    }

    #[test]
    fn bad_inputs_are_one_line_errors() {
        let m = crate::ops::affine::AffineMatrix::new(
            4,
            32,
            [2, 3, 32],
            vec![0u32; 2 * 3 * 4],
            vec![1f32; 6],
            vec![0f32; 6],
        )
        .unwrap();
        let m = AffineTensor::upload(&m, &Device::Cpu).unwrap();
        let x = Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap();
        for (offsets, want) in [
            (&[0u32, 4][..], "2 offsets for 2 experts"),
            (&[1, 2, 4], "start at 1"),
            (&[0, 3, 2], "decrease at expert 1"),
            (&[0, 1, 5], "end at 5, but x has 4 rows"),
        ] {
            let err = m.grouped_matmul_t(&x, offsets).unwrap_err().to_string();
            assert!(
                err.starts_with("grouped matmul: ") && err.contains(want) && !err.contains('\n'),
                "{offsets:?}: {err}"
            );
        }
        let wide = Tensor::zeros((4, 64), DType::F32, &Device::Cpu).unwrap();
        let err = m.grouped_matmul_t(&wide, &[0, 1, 4]).unwrap_err();
        assert!(err.to_string().contains("must be [pairs, 32]"), "{err}");
        // No pairs: an empty result, no product.
        let none = Tensor::zeros((0, 32), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(
            m.grouped_matmul_t(&none, &[0, 0, 0]).unwrap().dims(),
            [0, 3]
        );
    }
}
