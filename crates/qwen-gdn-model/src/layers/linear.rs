//! Linear layers and embeddings over [`Matrix`] weights.

use crate::weights::{Checkpoint, Matrix};
use crate::Config;
use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor, D};

/// `y = x Wᵀ (+ b)` with W quantized or float, computed in f32.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn load(
        ckpt: &Checkpoint,
        module: &str,
        out: usize,
        inp: usize,
        config: &Config,
    ) -> Result<Self> {
        Ok(Self {
            weight: ckpt.matrix(module, out, inp, config)?,
            bias: ckpt.bias(module, out)?,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.weight.rows()
    }

    /// `x`: `[..., in]` → `[..., out]`, in x's dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ensure!(
            x.device().is_cpu(),
            "quantized matmul runs on the CPU only so far (got {:?})",
            x.device()
        );
        let (rows, cols) = (self.weight.rows(), self.weight.cols());
        let mut out_shape = x.dims().to_vec();
        ensure!(
            out_shape.last() == Some(&cols),
            "linear: input {:?} does not end in {cols}",
            x.dims()
        );
        *out_shape.last_mut().unwrap() = rows;
        let m = x.elem_count() / cols;
        let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let mut y = self.weight.matmul_t(0, &xs, m);
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(rows) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        Ok(Tensor::from_vec(y, out_shape, x.device())?.to_dtype(x.dtype())?)
    }
}

/// Several projections of the same input. Compatible neighbours are merged into one matrix at
/// load so that they cost one pass over the input; outputs are concatenated in order.
#[derive(Debug, Clone)]
pub struct FusedLinear {
    parts: Vec<Linear>,
    out_dims: Vec<usize>,
}

impl FusedLinear {
    pub fn new(parts: Vec<Linear>) -> Self {
        let out_dims = parts.iter().map(Linear::out_dim).collect();
        let mut merged: Vec<Linear> = vec![];
        for p in parts {
            if let Some(last) = merged.last_mut() {
                if last.bias.is_none() && p.bias.is_none() {
                    if let Some(w) = Matrix::concat_rows(&[&last.weight, &p.weight]) {
                        last.weight = w;
                        continue;
                    }
                }
            }
            merged.push(p);
        }
        Self {
            parts: merged,
            out_dims,
        }
    }

    /// Returns each projection's output, in the order given to [`FusedLinear::new`].
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let outs = self
            .parts
            .iter()
            .map(|p| p.forward(x))
            .collect::<Result<Vec<_>>>()?;
        let all = if outs.len() == 1 {
            outs.into_iter().next().unwrap()
        } else {
            Tensor::cat(&outs, D::Minus1)?
        };
        let mut start = 0;
        self.out_dims
            .iter()
            .map(|&n| {
                let t = all.narrow(D::Minus1, start, n)?;
                start += n;
                Ok(t)
            })
            .collect()
    }
}

/// Token embeddings; quantized tables dequantize only the looked-up rows.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub table: Matrix,
}

impl Embedding {
    /// `[n]` ids → `[n, hidden]` f32.
    pub fn forward(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        let (vocab, hidden) = (self.table.rows(), self.table.cols());
        let mut out = vec![0f32; ids.len() * hidden];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(hidden)) {
            ensure!(
                (id as usize) < vocab,
                "token id {id} is outside the vocabulary ({vocab})"
            );
            self.table.row_into(0, id as usize, row);
        }
        Ok(Tensor::from_vec(out, (ids.len(), hidden), device)?)
    }

    /// Tied output head: `h Eᵀ`.
    pub fn as_linear(&self) -> Linear {
        Linear {
            weight: self.table.clone(),
            bias: None,
        }
    }
}
