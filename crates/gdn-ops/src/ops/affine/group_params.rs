//! Per-group scales and biases of an affine-quantized matrix, in their stored dtype.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Per-group scales or biases, kept in the dtype they were stored in: f32 copies of bf16
/// values would add a ninth to a 4-bit group-64 matrix (8 bytes per 64 weights instead of
/// 4), to resident memory and to the bytes every decoded token reads. Kernels widen one
/// row's worth at a time.
#[derive(Debug, Clone)]
pub enum GroupParams {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl From<Vec<f32>> for GroupParams {
    fn from(v: Vec<f32>) -> Self {
        Self::F32(v)
    }
}

impl From<Vec<bf16>> for GroupParams {
    fn from(v: Vec<bf16>) -> Self {
        Self::Bf16(v)
    }
}

impl From<Vec<f16>> for GroupParams {
    fn from(v: Vec<f16>) -> Self {
        Self::F16(v)
    }
}

impl GroupParams {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
            Self::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            Self::F32(_) => DType::F32,
            Self::Bf16(_) => DType::BF16,
            Self::F16(_) => DType::F16,
        }
    }

    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }

    /// A copy of elements `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        match self {
            Self::F32(v) => Self::F32(v[range].to_vec()),
            Self::Bf16(v) => Self::Bf16(v[range].to_vec()),
            Self::F16(v) => Self::F16(v[range].to_vec()),
        }
    }

    /// Widens elements `start .. start + out.len()` into `out` (exactly: f32 holds every
    /// bf16 and f16 value).
    #[inline]
    pub fn widen_into(&self, start: usize, out: &mut [f32]) {
        let range = start..start + out.len();
        match self {
            Self::F32(v) => out.copy_from_slice(&v[range]),
            // A bf16 is the top half of an f32: a shift the compiler vectorises.
            Self::Bf16(v) => out
                .iter_mut()
                .zip(&v[range])
                .for_each(|(o, x)| *o = f32::from_bits((x.to_bits() as u32) << 16)),
            Self::F16(v) => v[range].convert_to_f32_slice(out),
        }
    }

    /// Every element widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.widen_into(0, &mut out);
        out
    }

    /// A tensor of `shape` on `device`, in this dtype.
    pub fn to_tensor(&self, shape: (usize, usize), device: &Device) -> Result<Tensor> {
        Ok(match self {
            Self::F32(v) => Tensor::from_slice(v, shape, device)?,
            Self::Bf16(v) => Tensor::from_slice(v, shape, device)?,
            Self::F16(v) => Tensor::from_slice(v, shape, device)?,
        })
    }

    pub(crate) fn empty_like(&self) -> Self {
        match self {
            Self::F32(_) => Self::F32(vec![]),
            Self::Bf16(_) => Self::Bf16(vec![]),
            Self::F16(_) => Self::F16(vec![]),
        }
    }

    /// Appends `other[range]`; `None` if the dtypes differ.
    pub(crate) fn extend_from(
        &mut self,
        other: &Self,
        range: std::ops::Range<usize>,
    ) -> Option<()> {
        match (self, other) {
            (Self::F32(a), Self::F32(b)) => a.extend_from_slice(&b[range]),
            (Self::Bf16(a), Self::Bf16(b)) => a.extend_from_slice(&b[range]),
            (Self::F16(a), Self::F16(b)) => a.extend_from_slice(&b[range]),
            _ => return None,
        }
        Some(())
    }
}
