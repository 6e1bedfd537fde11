//! Linear layers and embeddings over [`Weight`]s.

use crate::candle_ops::cat;
use crate::tensor::cast;
use crate::weights::{Checkpoint, Matrix, Weight};
use crate::Config;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::candle_op;

/// `y = x Wᵀ (+ b)`, in x's dtype.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
    /// `[out]`, f32 in the reference plan, the compute dtype on the device.
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn load(
        ckpt: &Checkpoint,
        module: &str,
        out: usize,
        inp: usize,
        config: &Config,
    ) -> Result<Self> {
        let bias = match ckpt.bias(module, out)? {
            Some(b) => Some(Tensor::from_vec(b, out, &Device::Cpu)?),
            None => None,
        };
        Ok(Self {
            weight: Weight::Host(ckpt.matrix(module, out, inp, config)?),
            bias,
        })
    }

    /// A host matrix without bias (loaders that permute or split rows build these).
    pub fn from_matrix(m: Matrix) -> Self {
        Self {
            weight: Weight::Host(m),
            bias: None,
        }
    }

    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            weight: self.weight.into_device(device, dtype)?,
            bias: self
                .bias
                .map(|b| b.to_device(device)?.to_dtype(dtype))
                .transpose()?,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.weight.rows()
    }

    /// `x`: `[..., in]` → `[..., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weight.matmul_t(x)?;
        match &self.bias {
            Some(b) => candle_op(y.broadcast_add(&cast(b, y.dtype())?)),
            None => Ok(y),
        }
    }
}

/// Several projections of the same input. Compatible neighbours are merged into one matrix at
/// load so that they cost one pass over the input; outputs are returned as views of it.
#[derive(Debug, Clone)]
pub struct FusedLinear {
    parts: Vec<Linear>,
    out_dims: Vec<usize>,
}

impl FusedLinear {
    /// Merges host matrices; call before [`FusedLinear::into_device`].
    pub fn new(parts: Vec<Linear>) -> Self {
        let out_dims = parts.iter().map(Linear::out_dim).collect();
        let mut merged: Vec<Linear> = vec![];
        for p in parts {
            if let Some(last) = merged.last_mut() {
                if let (None, None, Weight::Host(a), Weight::Host(b)) =
                    (&last.bias, &p.bias, &last.weight, &p.weight)
                {
                    if let Some(w) = Matrix::concat_rows(&[a, b]) {
                        last.weight = Weight::Host(w);
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

    /// The one merged product, when every projection went into a single matrix without bias
    /// (its rows are the projections' rows, in order).
    pub fn merged(&self) -> Option<&Linear> {
        match &self.parts[..] {
            [only] if only.bias.is_none() => Some(only),
            _ => None,
        }
    }

    /// Output width of each projection, in order.
    pub fn out_dims(&self) -> &[usize] {
        &self.out_dims
    }

    /// Keeps, of each output part `i`, its rows `keep[i]` (in that order): a tensor-parallel
    /// rank's heads (`layers/head_shard.rs`). Host weights only (the reference plan).
    pub fn select_outputs(&self, keep: &[Vec<usize>]) -> Result<Self> {
        anyhow::ensure!(
            keep.len() == self.out_dims.len(),
            "{} row lists for {} fused outputs",
            keep.len(),
            self.out_dims.len()
        );
        // Global row numbers over the concatenated outputs, then cut per merged product.
        let mut wanted = vec![];
        let mut start = 0;
        for (rows, &n) in keep.iter().zip(&self.out_dims) {
            anyhow::ensure!(rows.iter().all(|&r| r < n), "a kept row is past {n}");
            wanted.extend(rows.iter().map(|&r| start + r));
            start += n;
        }
        let mut parts = vec![];
        let mut first = 0;
        for part in &self.parts {
            let n = part.out_dim();
            let local: Vec<usize> = wanted
                .iter()
                .filter(|&&g| (first..first + n).contains(&g))
                .map(|&g| g - first)
                .collect();
            first += n;
            if local.is_empty() {
                continue;
            }
            let Weight::Host(m) = &part.weight else {
                anyhow::bail!("tensor parallel runs the reference plan (host weights)");
            };
            let bias = match &part.bias {
                Some(b) => {
                    let idx = Tensor::new(
                        local.iter().map(|&r| r as u32).collect::<Vec<_>>(),
                        b.device(),
                    )?;
                    Some(b.index_select(&idx, 0)?)
                }
                None => None,
            };
            parts.push(Linear {
                weight: Weight::Host(m.select_rows(&local)),
                bias,
            });
        }
        Ok(Self {
            parts,
            out_dims: keep.iter().map(Vec::len).collect(),
        })
    }

    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            parts: self
                .parts
                .into_iter()
                .map(|p| p.into_device(device, dtype))
                .collect::<Result<_>>()?,
            out_dims: self.out_dims,
        })
    }

    /// Returns each projection's output, in the order given to [`FusedLinear::new`].
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let outs = self
            .parts
            .iter()
            .map(|p| p.forward(x))
            .collect::<Result<Vec<_>>>()?;
        let all = if outs.len() == 1 {
            outs.into_iter().next().expect("one output")
        } else {
            cat(&outs, D::Minus1)?
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
    pub table: Weight,
}

impl Embedding {
    /// `[n]` ids → `[n, hidden]` in `dtype` on `device`.
    pub fn forward(&self, ids: &[u32], device: &Device, dtype: DType) -> Result<Tensor> {
        self.table.rows_of(ids, device, dtype)
    }

    /// `[n]` u32 ids already on the device → `[n, hidden]` in `dtype`.
    pub fn forward_ids(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        self.table.rows_of_tensor(ids, dtype)
    }

    /// Tied output head: `h Eᵀ`.
    pub fn as_linear(&self) -> Linear {
        Linear {
            weight: self.table.clone(),
            bias: None,
        }
    }
}
