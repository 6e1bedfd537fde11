//! The activation types the fused kernels take, with their rounding and ulp.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    F32,
    F16,
    Bf16,
}

pub const TYPES: [Ty; 3] = [Ty::F32, Ty::F16, Ty::Bf16];

impl Ty {
    /// The harnesses' type code.
    pub fn code(self) -> u32 {
        self as u32
    }
    pub fn name(self) -> &'static str {
        ["f32", "f16", "bf16"][self as usize]
    }
    /// The Metal type name.
    pub fn msl(self) -> &'static str {
        ["float", "half", "bfloat"][self as usize]
    }
    pub fn dtype(self) -> DType {
        [DType::F32, DType::F16, DType::BF16][self as usize]
    }
    /// The type of an activation dtype (f32, f16 or bf16).
    pub fn of(dtype: DType) -> Self {
        TYPES[[DType::F32, DType::F16, DType::BF16]
            .iter()
            .position(|&d| d == dtype)
            .expect("an activation dtype")]
    }
    pub fn round(self, x: f32) -> f32 {
        match self {
            Ty::F32 => x,
            Ty::F16 => f16::from_f32(x).to_f32(),
            Ty::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
    /// Mantissa bits and the least normal exponent.
    fn format(self) -> (i32, i32) {
        match self {
            Ty::F32 => (23, -126),
            Ty::F16 => (10, -14),
            Ty::Bf16 => (7, -126),
        }
    }
    /// Spacing of values of this type at magnitude |x|.
    pub fn ulp(self, x: f32) -> f32 {
        let (mantissa_bits, min_exp) = self.format();
        let exp = (x != 0.0).then(|| x.abs().log2().floor() as i32);
        2f32.powi(exp.unwrap_or(min_exp).max(min_exp) - mantissa_bits)
    }
    /// [`Ty::ulp`] in f64, for gates computed in f64.
    pub fn ulp64(self, x: f64) -> f64 {
        let (mantissa_bits, min_exp) = self.format();
        let exp = (x != 0.0).then(|| x.abs().log2().floor() as i32);
        2f64.powi(exp.unwrap_or(min_exp).max(min_exp) - mantissa_bits)
    }
}

/// A CPU tensor of `ty` holding `v` (exactly, when `v` is already rounded to `ty`).
pub fn tensor(v: &[f32], shape: &[usize], ty: Ty) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(ty.dtype())
        .unwrap()
}

/// A CPU tensor of `dtype` holding `v`, converted from f32.
pub fn tensor_as(v: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// A recurrent state's dtype (the kernels keep f32 or bf16 state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum St {
    F32,
    Bf16,
}

impl St {
    /// The harnesses' state type code.
    pub fn code(self) -> u32 {
        self as u32
    }
    pub fn name(self) -> &'static str {
        ["f32", "bf16"][self as usize]
    }
    /// The Metal type name.
    pub fn msl(self) -> &'static str {
        ["float", "bfloat"][self as usize]
    }
    pub fn dtype(self) -> DType {
        [DType::F32, DType::BF16][self as usize]
    }
}
