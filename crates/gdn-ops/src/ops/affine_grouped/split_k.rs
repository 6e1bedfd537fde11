//! Split-K for the grouped GEMM's dense case (issue 29): one matrix times 9–64 activation rows
//! (a batched decode step's projections) as [`AffineTensor::split_matmul_t`].
//!
//! The grouped GEMM (`kernels/affine_grouped.cu`) gives a block 128 output rows and walks all
//! the columns: a 2 048-row out-projection gets 16 blocks for the H200's 132 SMs. Here the
//! columns are cut into slices of whole 64-column steps, one block per (row block, slice),
//! each writing its f32 partial sums into a workspace `[slices, rows_x, outputs]`, and a second
//! launch (`affine_split_sum_*`) adds the slices in order 0, 1, … into y: the same bits every
//! run (no float atomics), within the f32 gate of the dequantizing path (other sum orders).
//!
//! The CPU twin is the grouped GEMM's ([`super::cpu`]: dequantize, round into x's dtype,
//! multiply in f32); the slicing is the kernel's and its emulation's
//! (tests/affine_grouped_cuda_emulation.rs and tests/affine_grouped_emulation.rs run the
//! shipped CUDA and Metal bodies sliced against the twin).

use super::slicing::slicing;
use crate::launches;
use crate::ops::affine::AffineTensor;
use crate::profile::{self, elems_bytes, Traffic};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

impl AffineTensor {
    /// `x Wᵀ` for a single matrix and 2-D `x` `[n, cols]` (n ≤ the grouped GEMM's tile,
    /// [`super::TILE_PAIRS`]) by the split-K grouped GEMM where the device has it
    /// ([`Self::has_split_kernel`]): CUDA and Metal run `affine_grouped_split_*` and the
    /// fixed-order sum, the CPU the twin; elsewhere the grouped path.
    pub fn split_matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        let n = x.dim(0)?;
        let offsets = [0, n as u32];
        // Bytes moved: x and the packed matrix read once, the f32 partial sums written and
        // read once more when there are several slices, y written.
        let traffic = || {
            let (_, slices) = slicing(self.rows, self.cols);
            let partials = if slices > 1 {
                2 * slices * n * self.rows * 4
            } else {
                0
            };
            Ok(Traffic::new()
                .read_all(x)
                .read(self.rows * self.row_bytes() + partials)
                .write(elems_bytes(n * self.rows, x.dtype())))
        };
        let device = self.device();
        profile::kernel("affine_split_k", device, traffic, || match device {
            Device::Cpu => launches::cpu_twin(|| super::cpu::grouped_products(self, x, &offsets)),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) if self.has_split_kernel(x) => super::cuda::split_matmul_t(self, x),
            #[cfg(any(feature = "metal", target_os = "macos"))]
            Device::Metal(_) if self.has_split_kernel(x) => super::metal::split_matmul_t(self, x),
            _ => self.grouped_matmul_t(x, &offsets),
        })
    }

    /// Whether [`Self::split_matmul_t`] runs the split kernel (or, on the CPU, its twin) for
    /// `x` on this device: the grouped kernel's shapes and dtypes, and 16-byte aligned x on
    /// CUDA; on Metal the formats of `kernels/affine_grouped.metal` (its split entries) and
    /// float activations.
    pub fn has_split_kernel(&self, x: &Tensor) -> bool {
        match self.device() {
            Device::Cpu => matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => self.has_grouped_kernel(x),
            #[cfg(any(feature = "metal", target_os = "macos"))]
            Device::Metal(_) => {
                self.experts == 1
                    && super::metal::supports(self)
                    && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
            }
            _ => false,
        }
    }
}
