//! Partial rotary embeddings: the first `dims` features of each head rotate in the
//! non-interleaved ("rotate half") layout, the rest pass through (mlx-lm-reference.md §3.7).

use crate::candle_ops::cat;
use crate::tensor::contiguous;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::candle_op;
use std::sync::Mutex;

/// The tables made last, for whichever rotation asks next: within a prefill chunk the queries
/// and keys of every attention layer rotate at the same positions, and making the tables costs
/// the host ~1 µs per position (two f64 trigonometric calls per frequency), during which a GPU
/// waits for the next launch.
static LAST_TABLES: Mutex<Option<Tables>> = Mutex::new(None);

/// cos and sin for positions `offset..offset + len` at `inv_freq`, in `dtype` on `device`.
struct Tables {
    inv_freq: Vec<f64>,
    span: Span,
    device: Device,
    cos: Tensor,
    sin: Tensor,
}

/// The positions `offset..offset + len` of a pair of tables, and their dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    offset: usize,
    len: usize,
    dtype: DType,
}

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

    /// cos and sin `[len, dims/2]` in `dtype` on `device`: those made last when they are for
    /// the same frequencies and positions ([`LAST_TABLES`]), else made anew.
    fn tables(&self, span: Span, device: &Device) -> Result<(Tensor, Tensor)> {
        let mut last = LAST_TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = last.as_ref().filter(|t| {
            t.span == span && t.inv_freq == self.inv_freq && t.device.same_device(device)
        }) {
            return Ok((t.cos.clone(), t.sin.clone()));
        }
        let (cos, sin) = self.make_tables(span, device)?;
        *last = Some(Tables {
            inv_freq: self.inv_freq.clone(),
            span,
            device: device.clone(),
            cos: cos.clone(),
            sin: sin.clone(),
        });
        Ok((cos, sin))
    }

    /// cos and sin `[len, dims/2]` in `dtype` on `device`, computed and cast on the host so
    /// that the device only receives them.
    fn make_tables(&self, span: Span, device: &Device) -> Result<(Tensor, Tensor)> {
        let Span { offset, len, dtype } = span;
        let half = self.dims / 2;
        let (mut cos, mut sin) = (
            Vec::with_capacity(len * half),
            Vec::with_capacity(len * half),
        );
        for p in offset..offset + len {
            let (c, s) = self.angles(p);
            cos.extend(c);
            sin.extend(s);
        }
        let place = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, (len, half), &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)?)
        };
        Ok((place(cos)?, place(sin)?))
    }

    /// cos and sin `[dims/2]` of position `p` (f32, computed in f64): one row of the tables,
    /// for a caller that writes it into a device buffer itself (a CUDA graph's input).
    pub fn angles(&self, p: usize) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|f| {
                let angle = p as f64 * f;
                (angle.cos() as f32, angle.sin() as f32)
            })
            .unzip()
    }

    /// `x`: `[B, heads, S, head_dim]` at absolute positions `offset..offset+S`.
    pub fn forward(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_, _, seq, _) = x.dims4()?;
        let span = Span {
            offset,
            len: seq,
            dtype: x.dtype(),
        };
        let (cos, sin) = self.tables(span, x.device())?;
        self.rotate(x, &cos, &sin)
    }

    /// `x` `[B, heads, S, head_dim]` rotated by the tables `cos`, `sin` `[S, dims/2]` (in
    /// `x`'s dtype, on its device).
    pub fn rotate(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let head_dim = x.dim(D::Minus1)?;
        let rotated = candle_op(candle_nn::rotary_emb::rope(
            &contiguous(&x.narrow(D::Minus1, 0, self.dims)?)?,
            cos,
            sin,
        ))?;
        if self.dims == head_dim {
            return Ok(rotated);
        }
        let pass = x.narrow(D::Minus1, self.dims, head_dim - self.dims)?;
        cat(&[&rotated, &pass], D::Minus1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_reused_only_for_the_same_frequencies_and_positions() {
        let (a, b) = (PartialRope::new(8, 10_000.0), PartialRope::new(8, 1_000.0));
        let dev = Device::Cpu;
        let calls = [
            (&a, 0, 5, DType::F32),
            (&a, 0, 5, DType::F32),
            (&b, 0, 5, DType::F32),
            (&a, 3, 5, DType::F32),
            (&a, 3, 4, DType::F32),
            (&a, 3, 4, DType::BF16),
            (&a, 3, 4, DType::BF16),
        ];
        for (rope, offset, len, dtype) in calls {
            let span = Span { offset, len, dtype };
            let got = rope.tables(span, &dev).unwrap();
            let want = rope.make_tables(span, &dev).unwrap();
            for (g, w) in [(got.0, want.0), (got.1, want.1)] {
                assert_eq!(g.dtype(), dtype);
                let f32s = |t: Tensor| t.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
                assert_eq!(f32s(g), f32s(w), "offset {offset} len {len} {dtype:?}");
            }
        }
    }
}
