//! A weight as a layer holds it. The reference plan keeps [`Matrix`] on the host and computes
//! in f32 with the CPU kernels; the device plan keeps the checkpoint's bytes as tensors on the
//! compute device (quantized matrices stay quantized) so that no product leaves the device.

use super::matrix::{FloatData, Matrix};
use crate::candle_ops::{index_select, matmul};
use crate::tensor::{cast, contiguous};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::affine::AffineTensor;

#[derive(Debug, Clone)]
pub enum Weight {
    /// Reference plan: host memory, f32 products by the CPU kernels.
    Host(Matrix),
    /// Device plan: MLX affine, products by `gdn_ops` kernels.
    Quantized(AffineTensor),
    /// Device plan: float `[experts, rows, cols]` in the compute dtype.
    Dense(Tensor),
}

impl Weight {
    /// The weight for the device plan on `device`, floats in `dtype`; consumes the host copy
    /// so that at most one layer exists twice while a model loads.
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(match self {
            Self::Host(Matrix::Affine(a)) => Self::Quantized(AffineTensor::upload(&a, device)?),
            Self::Host(Matrix::Float(f)) => {
                let shape = (f.experts, f.rows, f.cols);
                // Cast on the host: a Metal device without bf16 (macOS 13) has no kernel to
                // cast a bf16 checkpoint to the f16 it computes in.
                let host = &Device::Cpu;
                let t = match f.data {
                    FloatData::F32(v) => Tensor::from_vec(v, shape, host)?,
                    FloatData::Bf16(v) => Tensor::from_vec(v, shape, host)?,
                    FloatData::F16(v) => Tensor::from_vec(v, shape, host)?,
                };
                Self::Dense(t.to_dtype(dtype)?.to_device(device)?)
            }
            placed => placed,
        })
    }

    /// The host matrix (only before [`Weight::into_device`]: loaders permute and merge rows).
    pub fn host(&self) -> Result<&Matrix> {
        match self {
            Self::Host(m) => Ok(m),
            _ => bail!("weight is already on the device"),
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            Self::Host(m) => m.rows(),
            Self::Quantized(a) => a.rows,
            Self::Dense(t) => t.dims()[1],
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Self::Host(m) => m.cols(),
            Self::Quantized(a) => a.cols,
            Self::Dense(t) => t.dims()[2],
        }
    }

    /// Bytes one full pass over the weight reads.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Host(m) => m.bytes(),
            Self::Quantized(a) => a.bytes(),
            Self::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        }
    }

    /// `x Wᵀ` for a single matrix: `x` `[..., cols]` → `[..., rows]` in x's dtype.
    pub fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        let (rows, cols) = (self.rows(), self.cols());
        ensure!(
            x.dims().last() == Some(&cols),
            "linear: input {:?} does not end in {cols}",
            x.dims()
        );
        let mut out_shape = x.dims().to_vec();
        *out_shape.last_mut().expect("checked rank") = rows;
        let m = x.elem_count() / cols;
        match self {
            Self::Host(w) => {
                ensure!(
                    x.device().is_cpu(),
                    "host weights need CPU activations (got {:?})",
                    x.device()
                );
                let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let y = w.matmul_t(0, &xs, m);
                Ok(Tensor::from_vec(y, out_shape, x.device())?.to_dtype(x.dtype())?)
            }
            Self::Quantized(_) | Self::Dense(_) if super::row_exact::enabled() => {
                // Each group of rows as a decode step computes it: at most the matvec's rows
                // for packed weights, one row for float ones (a GEMM's blocking depends on m).
                let per_call = match self {
                    Self::Quantized(_) => gdn_ops::ops::affine::MATVEC_MAX_ROWS,
                    _ => 1,
                };
                let x2 = contiguous(x)?.reshape((m, cols))?;
                let parts = (0..m)
                    .step_by(per_call)
                    .map(|start| {
                        self.matmul_t_rows(&x2.narrow(0, start, per_call.min(m - start))?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(crate::candle_ops::cat(&parts, 0)?.reshape(out_shape)?)
            }
            _ => Ok(self
                .matmul_t_rows(&contiguous(x)?.reshape((m, cols))?)?
                .reshape(out_shape)?),
        }
    }

    /// A device weight's product with the rows `x` `[m, cols]`: `[m, rows]`.
    fn matmul_t_rows(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Quantized(a) => a.matmul_t(x),
            Self::Dense(w) => matmul(x, &w.squeeze(0)?.t()?),
            Self::Host(_) => bail!("host weights take the host products"),
        }
    }

    /// Expert products chosen on the device: `x` `[N, cols]` or `[N, k, cols]`, `ids` `[N, k]`
    /// u32 → `[N, k, rows]` (see [`AffineTensor::gather_matmul_t`]).
    pub fn gather_matmul_t(&self, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
        match self {
            Self::Quantized(a) => a.gather_matmul_t(x, ids),
            // Many tokens: grouped per expert, never one copy of an expert per pair.
            Self::Dense(w) if ids.dim(0)? > 1 => super::dense_experts::grouped_matmul_t(w, x, ids),
            Self::Dense(w) => {
                let (n, k) = ids.dims2()?;
                let (rows, cols) = (self.rows(), self.cols());
                // One row per slot: a copy of the broadcast token rows, or of a strided input.
                let x = match x.rank() {
                    2 => contiguous(&x.unsqueeze(1)?.broadcast_as((n, k, cols))?)?,
                    _ => contiguous(x)?,
                };
                // [N·k, rows, cols]: the selected experts' weights, gathered on the device.
                let w = index_select(w, &ids.flatten_all()?, 0)?;
                let y = matmul(&x.reshape((n * k, 1, cols))?, &w.transpose(1, 2)?)?;
                Ok(y.reshape((n, k, rows))?)
            }
            Self::Host(_) => bail!("expert gather needs device weights"),
        }
    }

    /// Rows of the (single) device matrix listed in `ids` (`[n]` u32 on its device), in
    /// `dtype`: an embedding lookup with no upload (the ids are trusted to be in range, as
    /// the caller checked them when it wrote them).
    pub fn rows_of_tensor(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        let n = ids.dim(0)?;
        match self {
            Self::Quantized(a) => a.dequantize(Some(ids), n, dtype),
            Self::Dense(t) => {
                let rows = index_select(&t.squeeze(0)?, ids, 0)?;
                cast(&rows, dtype)
            }
            Self::Host(_) => bail!("embedding lookup by device ids needs device weights"),
        }
    }

    /// Rows `ids` of the (single) matrix in `dtype`: embedding lookups.
    pub fn rows_of(&self, ids: &[u32], device: &Device, dtype: DType) -> Result<Tensor> {
        let (vocab, hidden) = (self.rows(), self.cols());
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary ({vocab})");
        }
        match self {
            Self::Host(m) => {
                let mut out = vec![0f32; ids.len() * hidden];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(hidden)) {
                    m.row_into(0, id as usize, row);
                }
                Ok(Tensor::from_vec(out, (ids.len(), hidden), device)?.to_dtype(dtype)?)
            }
            Self::Quantized(a) => {
                let ids = Tensor::new(ids, device)?;
                a.dequantize(Some(&ids), ids.dim(0)?, dtype)
            }
            Self::Dense(t) => {
                let ids = Tensor::new(ids, device)?;
                let rows = index_select(&t.squeeze(0)?, &ids, 0)?;
                cast(&rows, dtype)
            }
        }
    }
}
