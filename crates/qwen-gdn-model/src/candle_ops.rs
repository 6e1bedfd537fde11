//! Candle's own ops as the layers use them, each counted as the kernels it launches on a GPU
//! (`gdn_ops::launches`, docs/metal.md). Candle has no hook where its kernels are launched, so
//! the count sits here, in the one function each op goes through, and layer code calls these
//! without counting by hand (gdn-ops' ops count themselves the same way, in their backends'
//! launch functions).
//!
//! What is not here is still counted at its call with `launches::candle_op`: elementwise
//! arithmetic written inline (`a + b`, `x.exp()`), and the few calls whose recorded count is
//! not the op's own (a view charged as one launch, a concatenation of many parts as one).

use anyhow::Result;
use candle_core::shape::Dim;
use candle_core::{DType, Device, Shape, Tensor, WithDType};
use gdn_ops::launches::{candle_op, candle_ops};

/// A tensor of zeros: one fill kernel.
pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
    candle_op(Tensor::zeros(shape, dtype, device))
}

/// A tensor filled with `value`: one fill kernel.
pub fn full<T: WithDType>(value: T, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
    candle_op(Tensor::full(value, shape, device))
}

/// `parts` joined along `dim`: one copy kernel per part.
pub fn cat<A: AsRef<Tensor>, D: Dim>(parts: &[A], dim: D) -> Result<Tensor> {
    candle_ops(parts.len(), Tensor::cat(parts, dim))
}

/// `src` written into `buf` from position `start` of `dim`, in place: one copy kernel.
pub fn write_at<D: Dim>(buf: &Tensor, src: &Tensor, dim: D, start: usize) -> Result<()> {
    candle_op(buf.slice_set(src, dim, start))
}

/// Rows (or slices along `dim`) of `x` picked by `ids`: one gather kernel.
pub fn index_select<D: Dim>(x: &Tensor, ids: &Tensor, dim: D) -> Result<Tensor> {
    candle_op(x.index_select(ids, dim))
}

/// `a · b` (batched over leading dims): one GEMM.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    candle_op(a.matmul(b))
}

/// `1 / (1 + e^(−x))`: one kernel.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    candle_op(candle_nn::ops::sigmoid(x))
}

/// `x · sigmoid(x)`: one kernel.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    candle_op(x.silu())
}

/// Softmax over the last dim: one kernel.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    candle_op(candle_nn::ops::softmax_last_dim(x))
}

/// SwiGLU, `silu(gate) · up`: two kernels.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    candle_op(silu(gate)?.mul(up))
}
