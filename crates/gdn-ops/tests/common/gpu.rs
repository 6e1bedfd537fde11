//! The GPU the CUDA tests run on, and how close a kernel's results must be to the CPU twin's.

use candle_core::{DType, Device};

/// CUDA device 0; panics (the test fails, never skips) without one.
pub fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("no CUDA device: {e}"))
}

/// The relative error allowed between a CUDA kernel and its CPU twin at an activation dtype:
/// both round once from nearby f32 values.
pub fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 8e-3,
        DType::F16 => 1e-3,
        _ => 2e-5,
    }
}
