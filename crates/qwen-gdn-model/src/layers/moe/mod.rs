//! Sparse MoE block (mlx-lm-reference.md §3.8): softmax router, top-k experts with optional
//! renormalisation, SwiGLU experts, plus a shared expert scaled by `sigmoid(shared_gate(x))`.
//!
//! Two executions of the same block:
//! - reference plan (host weights): the routing is read on the host and tokens are grouped
//!   per selected expert, so each expert's weights are read once per call and unselected
//!   experts not at all;
//! - device plan: softmax, top-k and the expert products all stay on the device (the experts
//!   are picked by a gathered product reading the top-k ids there), so a decode step never
//!   waits for the host. Quantized experts are regrouped at load into [`StackedExperts`] (the
//!   shared expert as one more expert), the form the fused decode kernels read. In a
//!   prefill chunk the ids are read back once per layer and the products grouped per expert
//!   ([`grouped`]: one grouped GEMM per projection with [`MoePrefill::Gemm`], one product per
//!   expert with [`MoePrefill::Grouped`]; per (token, slot) pair with [`MoePrefill::Pairs`],
//!   the reference).

mod decode;
mod expert_shard;
pub mod grouped;
pub mod groups;
pub mod stacked;

use super::linear::Linear;
use super::mlp::Mlp;
use crate::candle_ops::{sigmoid, softmax_last_dim, swiglu};
use crate::tensor::{cast, contiguous};
use crate::weights::{Checkpoint, Matrix, Product, Weight};
use crate::Config;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
pub use expert_shard::ExpertShard;
use gdn_ops::launches::candle_op;
pub use grouped::{MoePrefill, MoePrefillAsked};
pub use stacked::StackedExperts;

#[derive(Debug, Clone)]
pub struct SparseMoe {
    experts: Experts,
    top_k: usize,
    norm_topk_prob: bool,
    /// How prefill chunks run the stacked experts' products.
    prefill: MoePrefill,
}

#[derive(Debug, Clone)]
enum Experts {
    /// As the checkpoint stores them: the reference plan, and device weights that do not
    /// share one quantized format.
    Separate(Box<SeparateExperts>),
    /// Device plan, quantized.
    Stacked(Box<StackedExperts>),
}

#[derive(Debug, Clone)]
struct SeparateExperts {
    router: Linear,
    /// Stacked `[E, Im, H]`, `[E, Im, H]`, `[E, H, Im]`.
    gate_proj: Weight,
    up_proj: Weight,
    down_proj: Weight,
    shared_expert: Option<(Mlp, Linear)>,
    /// Under expert parallelism, the experts the stacks above hold and how the ranks
    /// combine (`expert_shard.rs`); `None`: every expert.
    shard: Option<ExpertShard>,
}

/// The `k` most probable experts of one token, with their (optionally renormalised) weights.
pub fn route(probs: &[f32], k: usize, renormalise: bool) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> = order[..k].iter().map(|&e| (e, probs[e])).collect();
    if renormalise {
        let total: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= total);
    }
    chosen
}

impl SparseMoe {
    pub fn load(ckpt: &Checkpoint, prefix: &str, cfg: &Config) -> Result<Self> {
        let (h, e, im, is) = (
            cfg.hidden_size,
            cfg.num_experts,
            cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size,
        );
        let shared_expert = if is > 0 {
            Some((
                Mlp::load(ckpt, &format!("{prefix}.shared_expert"), h, is, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.shared_expert_gate"), 1, h, cfg)?,
            ))
        } else {
            None
        };
        Ok(Self {
            experts: Experts::Separate(Box::new(SeparateExperts {
                router: Linear::load(ckpt, &format!("{prefix}.gate"), e, h, cfg)?,
                gate_proj: Weight::Host(ckpt.experts(prefix, "gate_proj", e, im, h, cfg)?),
                up_proj: Weight::Host(ckpt.experts(prefix, "up_proj", e, im, h, cfg)?),
                down_proj: Weight::Host(ckpt.experts(prefix, "down_proj", e, h, im, cfg)?),
                shared_expert,
                shard: None,
            })),
            top_k: cfg.num_experts_per_tok,
            norm_topk_prob: cfg.norm_topk_prob,
            prefill: MoePrefill::Pairs,
        })
    }

    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        let Experts::Separate(s) = self.experts else {
            return Ok(self);
        };
        let stacked = StackedExperts::from_host(
            &s.router,
            [&s.gate_proj, &s.up_proj, &s.down_proj],
            s.shared_expert.as_ref(),
            device,
            dtype,
        )?;
        let experts = match stacked {
            Some(stacked) => Experts::Stacked(Box::new(stacked)),
            None => Experts::Separate(Box::new(s.into_device(device, dtype)?)),
        };
        Ok(Self { experts, ..self })
    }

    /// Keeps only experts `shard.experts` of the block (their stacks copied, the others
    /// dropped) and combines with the other ranks from now on. The reference plan only (host
    /// weights, before any move to the device).
    pub fn shard_experts(&mut self, shard: ExpertShard) -> Result<()> {
        let Experts::Separate(s) = &mut self.experts else {
            anyhow::bail!("expert parallel runs the reference plan (host weights); this block is on the device plan");
        };
        let (Weight::Host(g), Weight::Host(u), Weight::Host(d)) =
            (&s.gate_proj, &s.up_proj, &s.down_proj)
        else {
            anyhow::bail!("expert parallel runs the reference plan (host weights); this block's experts are on a device");
        };
        let range = shard.experts.clone();
        // Loaded whole (then the other ranks' experts are dropped here), or loaded as this
        // rank's share already (`ModelPart::Experts`: the others were never read).
        let loaded_as_share = g.experts() == range.len();
        anyhow::ensure!(
            s.shard.is_none() && (g.experts() == shard.total || loaded_as_share),
            "expert parallel: a block of {} experts sharded as experts {range:?} of {}",
            g.experts(),
            shard.total
        );
        if !loaded_as_share {
            (s.gate_proj, s.up_proj, s.down_proj) = (
                Weight::Host(g.experts_range(range.clone())?),
                Weight::Host(u.experts_range(range.clone())?),
                Weight::Host(d.experts_range(range)?),
            );
        }
        s.shard = Some(shard);
        Ok(())
    }

    /// The regrouped form, when the weights have one (device plan, quantized).
    pub fn stacked(&self) -> Option<&StackedExperts> {
        match &self.experts {
            Experts::Stacked(s) => Some(s),
            Experts::Separate(_) => None,
        }
    }

    /// How prefill chunks run the stacked experts' products (the separate form always groups
    /// float experts and runs quantized ones per pair).
    pub fn set_prefill(&mut self, mode: MoePrefill) {
        self.prefill = mode;
    }

    /// The router kernel's body, decode and prefill (the stacked form routes on the device;
    /// the separate form composes).
    pub fn set_route(&mut self, kernel: gdn_ops::ops::moe_route::RouteKernel) {
        if let Experts::Stacked(s) = &mut self.experts {
            s.route = kernel;
        }
    }

    /// `x`: `[B, S, H]` (already post-attention-normed).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let device_experts = !matches!(&self.experts, Experts::Separate(s) if matches!(s.gate_proj, Weight::Host(_)));
        let tokens = x.elem_count() / x.dim(D::Minus1)?;
        if device_experts && tokens > 1 && crate::weights::row_exact::enabled() {
            // Each token as a decode step routes and multiplies it (the grouped and GEMM
            // forms of several tokens sum in other orders).
            let rows = x.flatten_to(D::Minus2)?;
            let outs = (0..tokens)
                .map(|t| self.forward_tokens(&rows.narrow(0, t, 1)?))
                .collect::<Result<Vec<_>>>()?;
            return Ok(crate::candle_ops::cat(&outs, 0)?.reshape(x.dims())?);
        }
        self.forward_tokens(x)
    }

    fn forward_tokens(&self, x: &Tensor) -> Result<Tensor> {
        match &self.experts {
            Experts::Separate(s) => s.forward(x, self.top_k, self.norm_topk_prob),
            Experts::Stacked(s) => {
                let dims = x.dims().to_vec();
                let x = x.flatten_to(D::Minus2)?;
                let (top_k, renormalise) = (self.top_k, self.norm_topk_prob);
                let tokens = x.dim(0)?;
                let out = if self.prefill.gemm_for(tokens) {
                    s.forward_gemm(&x, top_k, renormalise)?
                } else {
                    match self.prefill.min_tokens_for(tokens) {
                        Some(min_tokens) => {
                            s.forward_grouped(&x, top_k, renormalise, min_tokens)?
                        }
                        None => s.forward_composed(&x, top_k, renormalise)?,
                    }
                };
                Ok(out.reshape(dims)?)
            }
        }
    }
}

impl SeparateExperts {
    fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            router: self.router.into_device(device, dtype)?,
            gate_proj: self.gate_proj.into_device(device, dtype)?,
            up_proj: self.up_proj.into_device(device, dtype)?,
            down_proj: self.down_proj.into_device(device, dtype)?,
            shared_expert: self
                .shared_expert
                .map(|(mlp, gate)| -> Result<_> {
                    Ok((
                        mlp.into_device(device, dtype)?,
                        gate.into_device(device, dtype)?,
                    ))
                })
                .transpose()?,
            shard: self.shard,
        })
    }

    fn forward(&self, x: &Tensor, top_k: usize, renormalise: bool) -> Result<Tensor> {
        let routed = match (&self.gate_proj, &self.up_proj, &self.down_proj) {
            (Weight::Host(g), Weight::Host(u), Weight::Host(d)) => {
                self.routed_on_host(x, [g, u, d], top_k, renormalise)?
            }
            _ => self.routed_on_device(x, top_k, renormalise)?,
        };
        match &self.shared_expert {
            Some((mlp, gate)) => {
                let scale = sigmoid(&gate.forward(x)?)?;
                let shared = candle_op(mlp.forward(x)?.broadcast_mul(&scale))?;
                candle_op(routed + shared)
            }
            None => Ok(routed),
        }
    }

    /// Router probabilities `[N, E]` in f32 for `x` `[N, H]`.
    fn probabilities(&self, x: &Tensor) -> Result<Tensor> {
        let logits = cast(&self.router.forward(x)?, DType::F32)?;
        softmax_last_dim(&logits)
    }

    fn routed_on_device(&self, x: &Tensor, top_k: usize, renormalise: bool) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let x = x.flatten_to(D::Minus2)?; // [N, H]
        let probs = self.probabilities(&x)?;
        let (ids, weights) = top_k_on_device(&probs, top_k, renormalise)?;
        let down = match (&self.gate_proj, &self.up_proj, &self.down_proj) {
            (Weight::Dense(g), Weight::Dense(u), Weight::Dense(d)) if x.dim(0)? > 1 => {
                grouped::dense_routed_grouped(&x, &ids, [g, u, d])?
            }
            _ => {
                let gate = self.gate_proj.gather_matmul_t(&x, &ids)?; // [N, k, Im]
                let up = self.up_proj.gather_matmul_t(&x, &ids)?;
                let act = swiglu(&gate, &up)?;
                self.down_proj.gather_matmul_t(&act, &ids)? // [N, k, H]
            }
        };
        Ok(weighted_sum(&down, &weights, x.dtype())?.reshape(dims)?)
    }

    fn routed_on_host(
        &self,
        x: &Tensor,
        [gate_proj, up_proj, down_proj]: [&Matrix; 3],
        top_k: usize,
        renormalise: bool,
    ) -> Result<Tensor> {
        let h = x.dim(D::Minus1)?;
        // Under expert parallelism the stacks hold experts `first ..` of `n_experts`.
        let (n_experts, owned) = match &self.shard {
            Some(s) => (s.total, s.experts.clone()),
            None => (gate_proj.experts(), 0..gate_proj.experts()),
        };
        let first = owned.start;
        let probs =
            gdn_ops::launches::read_back(self.probabilities(&x.flatten_to(D::Minus2)?)?.to_vec2())?;
        let xs = gdn_ops::launches::read_back(x.to_dtype(DType::F32)?.flatten_all()?.to_vec1())?;
        // Tokens per expert: (token index, routing weight).
        let mut assigned: Vec<Vec<(usize, f32)>> = vec![vec![]; n_experts];
        for (tok, p) in probs.iter().enumerate() {
            for (e, w) in route(p, top_k, renormalise) {
                assigned[e].push((tok, w));
            }
        }
        let chosen: Vec<(usize, &[(usize, f32)])> = assigned
            .iter()
            .enumerate()
            .filter(|(e, t)| !t.is_empty() && owned.contains(e))
            .map(|(e, t)| (e, t.as_slice()))
            .collect();
        let inputs: Vec<Vec<f32>> = chosen
            .iter()
            .map(|(_, tokens)| {
                tokens
                    .iter()
                    .flat_map(|&(t, _)| xs[t * h..(t + 1) * h].iter().copied())
                    .collect()
            })
            .collect();
        // Every chosen expert's gate and up products in one parallel pass, then every down
        // product in another: two wake-ups of the workers per layer, not three per expert.
        fn product<'a>(matrix: &'a Matrix, expert: usize, x: &'a [f32], m: usize) -> Product<'a> {
            Product {
                matrix,
                expert,
                x,
                m,
            }
        }
        let gate_up: Vec<Product> = chosen
            .iter()
            .zip(&inputs)
            .flat_map(|(&(e, tokens), x)| {
                let m = tokens.len();
                [
                    product(gate_proj, e - first, x, m),
                    product(up_proj, e - first, x, m),
                ]
            })
            .collect();
        let gate_up = Matrix::matmul_t_many(&gate_up);
        let acts: Vec<Vec<f32>> = gate_up
            .chunks_exact(2)
            .map(|gu| {
                gu[0]
                    .iter()
                    .zip(&gu[1])
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect()
            })
            .collect();
        let down: Vec<Product> = chosen
            .iter()
            .zip(&acts)
            .map(|(&(e, tokens), act)| product(down_proj, e - first, act, tokens.len()))
            .collect();
        let down = Matrix::matmul_t_many(&down);
        let out = match &self.shard {
            None => {
                let mut out = vec![0f32; xs.len()];
                for ((_, tokens), down) in chosen.iter().zip(down) {
                    for (&(t, w), y) in tokens.iter().zip(down.chunks_exact(h)) {
                        out[t * h..(t + 1) * h]
                            .iter_mut()
                            .zip(y)
                            .for_each(|(o, y)| *o += w * y);
                    }
                }
                out
            }
            Some(shard) => {
                // Each token's experts in ascending order (the order one process adds them
                // in): walking the experts in order lists them so.
                let mut experts_of: Vec<Vec<usize>> = vec![Vec::with_capacity(top_k); probs.len()];
                for (e, tokens) in assigned.iter().enumerate() {
                    tokens.iter().for_each(|&(t, _)| experts_of[t].push(e));
                }
                // Each weighted result into its (token, slot), the slot its expert's place
                // among the token's; the ranks then combine (expert_shard.rs).
                let mut slots = vec![0f32; experts_of.len() * top_k * h];
                for ((e, tokens), down) in chosen.iter().zip(down) {
                    for (&(t, w), y) in tokens.iter().zip(down.chunks_exact(h)) {
                        let j = experts_of[t]
                            .binary_search(e)
                            .expect("a token's own expert");
                        let at = (t * top_k + j) * h;
                        slots[at..at + h]
                            .iter_mut()
                            .zip(y)
                            .for_each(|(o, y)| *o = w * y);
                    }
                }
                shard.combine(slots, top_k, h)?
            }
        };
        Ok(Tensor::from_vec(out, x.dims(), x.device())?.to_dtype(x.dtype())?)
    }
}

/// The top-k experts of router probabilities `[N, E]` (f32) on the device: ids `[N, k]` u32
/// by a descending argsort, and their probabilities `[N, k]`, renormalised to sum to 1 if
/// asked. Ties (equal f32 probabilities) may order differently from [`route`]'s
/// lowest-index-first; both are valid top-k sets.
fn top_k_on_device(probs: &Tensor, top_k: usize, renormalise: bool) -> Result<(Tensor, Tensor)> {
    let sorted = candle_op(probs.arg_sort_last_dim(false))?;
    // The cut is copied only where it is a strided view (not for one token).
    let ids = contiguous(&sorted.narrow(D::Minus1, 0, top_k)?)?;
    let mut weights = candle_op(probs.gather(&ids, D::Minus1))?;
    if renormalise {
        let total = candle_op(weights.sum_keepdim(D::Minus1))?;
        weights = candle_op(weights.broadcast_div(&total))?;
    }
    Ok((ids, weights))
}

/// `Σ_s weights[n, s] · down[n, s, :]` in f32 for `down` `[N, S, H]` and f32 `weights`
/// `[N, S]`, returned `[N, H]` in `dtype`.
fn weighted_sum(down: &Tensor, weights: &Tensor, dtype: DType) -> Result<Tensor> {
    let weighted =
        candle_op(cast(down, DType::F32)?.broadcast_mul(&weights.unsqueeze(D::Minus1)?))?;
    cast(&candle_op(weighted.sum(1))?, dtype)
}

/// SwiGLU of stacked gate-and-up products: the last dim of `gate_up` holds the `inner` gate
/// values, then the `inner` up values; the result holds `silu(gate) · up` (two candle ops).
fn swiglu_halves(gate_up: &Tensor, inner: usize) -> Result<Tensor> {
    swiglu(
        &gate_up.narrow(D::Minus1, 0, inner)?,
        &gate_up.narrow(D::Minus1, inner, inner)?,
    )
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routing_picks_top_k_and_renormalises() {
        let p = [0.1, 0.4, 0.2, 0.3];
        assert_eq!(route(&p, 2, false), vec![(1, 0.4), (3, 0.3)]);
        let r = route(&p, 2, true);
        assert!((r[0].1 - 0.4 / 0.7).abs() < 1e-6 && (r[1].1 - 0.3 / 0.7).abs() < 1e-6);
    }
}
