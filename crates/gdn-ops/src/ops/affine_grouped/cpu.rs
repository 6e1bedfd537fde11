//! The CPU twin of the grouped GEMM, the reference every kernel is tested against.

use crate::ops::affine::{cpu, AffineTensor};
use anyhow::Result;
use candle_core::{DType, Tensor};

/// The CPU twin: per expert with rows, its weights dequantized and rounded once into x's
/// dtype (as the kernel stages them), multiplied with x in f32, rounded once into x's dtype.
pub(crate) fn grouped_products(m: &AffineTensor, x: &Tensor, offsets: &[u32]) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let mut parts = vec![];
    for (e, span) in offsets.windows(2).enumerate() {
        let (start, len) = (span[0] as usize, (span[1] - span[0]) as usize);
        if len == 0 {
            continue;
        }
        let w = cpu::dequantize(&m.expert(e)?, None, m.rows, dtype)?.to_dtype(DType::F32)?;
        parts.push(xf.narrow(0, start, len)?.matmul(&w.t()?)?);
    }
    Ok(Tensor::cat(&parts, 0)?.to_dtype(dtype)?)
}
