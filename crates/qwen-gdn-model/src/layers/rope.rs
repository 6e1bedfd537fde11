//! Partial rotary embeddings: the first `dims` features of each head rotate in the
//! non-interleaved ("rotate half") layout, the rest pass through (mlx-lm-reference.md §3.7).

use super::norm::contiguous;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::{candle_op, candle_ops};

#[derive(Debug, Clone)]
pub struct PartialRope {
    dims: usize,
    /// `base^(-2i/dims)` for `i < dims/2`, kept in f64 so angles stay exact at long range.
    inv_freq: Vec<f64>,
}

impl PartialRope {
    pub fn new(dims: usize, base: f64) -> Self {
        let inv_freq = (0..dims / 2)
            .map(|i| base.powf(-((2 * i) as f64) / dims as f64))
            .collect();
        Self { dims, inv_freq }
    }

    /// Rotated features per head.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The inverse frequencies `[dims/2]` in f32, for kernels that compute the angles on the
    /// device from a position they read there (f32 angles, as MLX computes them).
    pub fn inv_freq_tensor(&self, device: &Device) -> Result<Tensor> {
        let f: Vec<f32> = self.inv_freq.iter().map(|&f| f as f32).collect();
        Ok(Tensor::from_vec(f, self.inv_freq.len(), device)?)
    }

    /// cos and sin `[len, dims/2]` in `dtype` on `device`, computed and cast on the host so
    /// that the device only receives them.
    fn tables(
        &self,
        offset: usize,
        len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.dims / 2;
        let (mut cos, mut sin) = (
            Vec::with_capacity(len * half),
            Vec::with_capacity(len * half),
        );
        for p in offset..offset + len {
            for f in &self.inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let place = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, (len, half), &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)?)
        };
        Ok((place(cos)?, place(sin)?))
    }

    /// `x`: `[B, heads, S, head_dim]` at absolute positions `offset..offset+S`.
    pub fn forward(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_, _, seq, head_dim) = x.dims4()?;
        let (cos, sin) = self.tables(offset, seq, x.dtype(), x.device())?;
        let rotated = candle_op(candle_nn::rotary_emb::rope(
            &contiguous(&x.narrow(D::Minus1, 0, self.dims)?)?,
            &cos,
            &sin,
        ))?;
        if self.dims == head_dim {
            return Ok(rotated);
        }
        let pass = x.narrow(D::Minus1, self.dims, head_dim - self.dims)?;
        candle_ops(2, Tensor::cat(&[&rotated, &pass], D::Minus1))
    }
}
