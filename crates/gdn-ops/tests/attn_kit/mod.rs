//! Shared by the emulation and CUDA tests of add_rms_norm, attn_prep and attn_decode:
//! activation types, reproducible random inputs, the harness input encoding, and the
//! tolerance check.
#![allow(dead_code)]

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
    pub fn dtype(self) -> DType {
        [DType::F32, DType::F16, DType::BF16][self as usize]
    }
    pub fn round(self, x: f32) -> f32 {
        match self {
            Ty::F32 => x,
            Ty::F16 => f16::from_f32(x).to_f32(),
            Ty::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
    /// Spacing of values of this type at magnitude |x|.
    pub fn ulp(self, x: f32) -> f32 {
        let (mantissa_bits, min_exp) = match self {
            Ty::F32 => (23, -126),
            Ty::F16 => (10, -14),
            Ty::Bf16 => (7, -126),
        };
        let exp = if x == 0.0 {
            min_exp
        } else {
            (x.abs().log2().floor() as i32).max(min_exp)
        };
        2f32.powi(exp - mantissa_bits)
    }
}

/// splitmix64: inputs need no dependency and are the same everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// `n` values in `[lo, hi)`, rounded to `ty`.
    pub fn values(&mut self, n: usize, lo: f32, hi: f32, ty: Ty) -> Vec<f32> {
        (0..n).map(|_| ty.round(self.uniform(lo, hi))).collect()
    }
}

/// A CPU tensor of `ty` holding `v` (exactly, when `v` is already rounded to `ty`).
pub fn tensor(v: &[f32], shape: &[usize], ty: Ty) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(ty.dtype())
        .unwrap()
}

/// Every element of a tensor on any device, in f32.
pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Little-endian harness input.
#[derive(Default)]
pub struct Input(pub Vec<u8>);

impl Input {
    pub fn new(magic: &[u8; 8]) -> Self {
        Self(magic.to_vec())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        for x in v {
            self.0.extend(x.to_le_bytes());
        }
        self
    }
}

/// `None` when every `got[i]` is within `ulps` ulp of `ty` at `want[i]` plus `rel` of
/// max |want| (the f32 arithmetic both sides do in different orders); otherwise the worst
/// element. NaN fails.
pub fn close(what: &str, got: &[f32], want: &[f32], ty: Ty, ulps: f32, rel: f32) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut worst: Option<(f32, usize)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let allowed = ulps * ty.ulp(w) + rel * scale;
        let err = (g - w).abs();
        if err.is_nan() || err > allowed {
            let excess = if err.is_nan() {
                f32::INFINITY
            } else {
                err / allowed
            };
            if worst.is_none_or(|(e, _)| excess > e) {
                worst = Some((excess, i));
            }
        }
    }
    worst.map(|(excess, i)| {
        format!(
            "{what}[{i}] = {} but the twin has {} ({excess:.1}× the allowance; max |ref| {scale})",
            got[i], want[i]
        )
    })
}
