//! Gated DeltaNet linear attention (mlx-lm-reference.md §3.1–3.5).
//!
//! ```text
//! [q k v | z | b | a] = in_proj(x)
//! q, k, v  = silu(causal_depthwise_conv([conv_state; qkv]))
//! q = rms(q)/Dk,  k = rms(k)/√Dk            (L2 norm, attention scale folded into q)
//! β = sigmoid(b),  g = exp(−exp(A_log) · softplus(a + dt_bias))
//! y = gated_delta_update(q, k, v, g, β, state)        (state advanced in place)
//! out = out_proj(rms_norm(y) · w · silu(z))
//! ```
//! Both families reach the same `[q k v | z | b | a]` projection: Qwen3-Next's per-key-head
//! interleaved `in_proj_qkvz` / `in_proj_ba` rows are permuted at load (lossless, also for
//! quantized weights), Qwen3.5's separate projections are stacked.

use super::head_shard::{all_heads, head_rows, HeadShard};
use super::linear::{FusedLinear, Linear};
use super::norm::{Gate, GatedRmsNorm, RmsNorm, ScaledRms};
use crate::cache::GdnCache;
use crate::candle_ops::{cat, sigmoid, silu, zeros};
use crate::config::Family;
use crate::tensor::{cast, contiguous};
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::candle_op;
use gdn_ops::profile::labelled;

mod conv_front;
mod decode;
pub mod steps;
mod verify;

pub use conv_front::ConvFront;
pub use steps::GdnSteps;
pub use verify::VerifyWindow;

#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    in_proj: FusedLinear,
    /// `[K, conv_dim]`: tap `m` is row `m`, which broadcasts over `[B, S, conv_dim]`.
    conv_taps: Tensor,
    /// `−exp(A_log)`, so that the decay is one product and one `exp` away from softplus.
    neg_a_log_exp: Tensor,
    dt_bias: Tensor,
    norm: GatedRmsNorm,
    /// L2 normalisation of q (scaled by 1/Dk) and k (by 1/√Dk).
    q_norm: ScaledRms,
    k_norm: ScaledRms,
    out_proj: Linear,
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
    kernel: usize,
    /// How `forward` computes the conv front: composed ops unless the device plan picks the
    /// fused kernel ([`ConvFront::for_layer`], at [`GatedDeltaNet::set_variants`]).
    conv_front: ConvFront,
    /// How the fused verify pass runs a window's recurrence (`verify.rs`).
    verify_window: VerifyWindow,
    /// The form every recurrence call takes, when the run forces one (else the length picks).
    gdn_prefill: Option<gdn_ops::GdnForm>,
    /// Under tensor parallel: this rank's value heads (`key_heads`/`value_heads` are then the
    /// rank's), gathered over the ranks before `out_proj` ([`GatedDeltaNet::shard_heads`]).
    shard: Option<HeadShard>,
}

/// Row order that turns Qwen3-Next's per-key-head groups
/// `[q_j | k_j | v_j (r·Dv) | z_j (r·Dv)]` into `[all q | all k | all v | all z]`.
fn qkvz_rows(hk: usize, dk: usize, r_dv: usize) -> Vec<usize> {
    let group = 2 * dk + 2 * r_dv;
    let pieces = [(0, dk), (dk, dk), (2 * dk, r_dv), (2 * dk + r_dv, r_dv)];
    pieces
        .iter()
        .flat_map(|&(start, len)| {
            (0..hk).flat_map(move |j| (0..len).map(move |i| j * group + start + i))
        })
        .collect()
}

/// Row order that turns per-key-head `[b_j (r) | a_j (r)]` into `[all b | all a]`.
fn ba_rows(hk: usize, r: usize) -> Vec<usize> {
    [0, r]
        .iter()
        .flat_map(|&start| (0..hk).flat_map(move |j| (0..r).map(move |i| j * 2 * r + start + i)))
        .collect()
}

impl GatedDeltaNet {
    /// Loads the layer at `prefix`; `output_gate` is the family's gate of the output norm.
    pub fn load(ckpt: &Checkpoint, prefix: &str, cfg: &Config, output_gate: Gate) -> Result<Self> {
        let h = cfg.hidden_size;
        let (hk, hv, dk, dv) = (
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
        );
        let (key_dim, value_dim, conv_dim) = (cfg.key_dim(), cfg.value_dim(), cfg.conv_dim());
        let r = hv / hk;
        let dev = &Device::Cpu;
        let lin = |name: &str, out: usize, inp: usize| {
            Linear::load(ckpt, &format!("{prefix}.{name}"), out, inp, cfg)
        };
        let parts = match cfg.family {
            Family::Qwen3Next => {
                let qkvz = lin("in_proj_qkvz", 2 * key_dim + 2 * value_dim, h)?;
                let ba = lin("in_proj_ba", 2 * hv, h)?;
                let qkvz = qkvz.weight.host()?.select_rows(&qkvz_rows(hk, dk, r * dv));
                let ba = ba.weight.host()?.select_rows(&ba_rows(hk, r));
                // Split so that every projection keeps its own output width.
                let take = |m: &crate::weights::Matrix, start: usize, n: usize| {
                    Linear::from_matrix(m.select_rows(&(start..start + n).collect::<Vec<_>>()))
                };
                vec![
                    take(&qkvz, 0, conv_dim),
                    take(&qkvz, conv_dim, value_dim),
                    take(&ba, 0, hv),
                    take(&ba, hv, hv),
                ]
            }
            Family::Qwen35 => vec![
                lin("in_proj_qkv", conv_dim, h)?,
                lin("in_proj_z", value_dim, h)?,
                lin("in_proj_b", hv, h)?,
                lin("in_proj_a", hv, h)?,
            ],
        };
        let a_log = ckpt.tensor(&format!("{prefix}.A_log"), &[hv], dev)?;
        Ok(Self {
            in_proj: FusedLinear::new(parts),
            conv_taps: ckpt
                .conv1d(
                    &format!("{prefix}.conv1d.weight"),
                    conv_dim,
                    cfg.linear_conv_kernel_dim,
                    dev,
                )?
                .t()?
                .contiguous()?,
            neg_a_log_exp: a_log.exp()?.neg()?,
            dt_bias: ckpt.tensor(&format!("{prefix}.dt_bias"), &[hv], dev)?,
            norm: GatedRmsNorm {
                norm: RmsNorm {
                    weight: ckpt.norm(&format!("{prefix}.norm.weight"), dv, dev)?,
                    eps: cfg.rms_norm_eps as f32,
                },
                gate: output_gate,
            },
            q_norm: ScaledRms::new(dk, 1.0 / dk as f64, 1e-6)?,
            k_norm: ScaledRms::new(dk, (dk as f64).powf(-0.5), 1e-6)?,
            out_proj: lin("out_proj", h, value_dim)?,
            key_heads: hk,
            value_heads: hv,
            key_dim: dk,
            value_dim: dv,
            kernel: cfg.linear_conv_kernel_dim,
            conv_front: ConvFront::Composed,
            verify_window: VerifyWindow::OneLaunch,
            gdn_prefill: None,
            shard: None,
        })
    }

    /// Keeps only the value heads `shard.heads` and the key heads they read
    /// ([`HeadShard::key_heads`]): the rows of the in-projections, the conv's channels and
    /// the heads' decay parameters. The reference plan only (host weights).
    pub fn shard_heads(&mut self, shard: HeadShard) -> Result<()> {
        let (hk, hv, dk, dv) = (
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
        );
        anyhow::ensure!(
            self.shard.is_none() && shard.total == hv && shard.heads.end <= hv,
            "tensor parallel: value heads {:?} of {} asked of a GDN layer of {hv}",
            shard.heads,
            shard.total
        );
        let keys = shard.key_heads(hv / hk);
        let values: Vec<usize> = shard.heads.clone().collect();
        // The conv's channels are `[q | k | v]`; z, b and a follow the value heads.
        let qkv = [
            head_rows(&keys, dk, 0),
            head_rows(&keys, dk, hk * dk),
            head_rows(&values, dv, 2 * hk * dk),
        ]
        .concat();
        self.in_proj = self.in_proj.select_outputs(&[
            qkv.clone(),
            head_rows(&values, dv, 0),
            values.clone(),
            values.clone(),
        ])?;
        let index = |rows: &[usize]| {
            Tensor::new(
                rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
                &Device::Cpu,
            )
        };
        self.conv_taps = self.conv_taps.index_select(&index(&qkv)?, 1)?;
        self.neg_a_log_exp = self.neg_a_log_exp.index_select(&index(&values)?, 0)?;
        self.dt_bias = self.dt_bias.index_select(&index(&values)?, 0)?;
        (self.key_heads, self.value_heads) = (keys.len(), values.len());
        self.shard = Some(shard);
        Ok(())
    }

    /// The device plan's copy: weights on `device`, activations in `dtype`; the decay
    /// parameters stay f32 as the recurrence's inputs are. The conv front is fused where the
    /// device and the kernels allow it, unless the run asks otherwise
    /// ([`GatedDeltaNet::set_variants`]).
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        let norm = |n: RmsNorm| n.into_device(device, dtype);
        Ok(Self {
            conv_front: ConvFront::for_layer(None, device, &self.conv_prep_dims(), dtype),
            in_proj: self.in_proj.into_device(device, dtype)?,
            conv_taps: self.conv_taps.to_device(device)?.to_dtype(dtype)?,
            neg_a_log_exp: self.neg_a_log_exp.to_device(device)?,
            dt_bias: self.dt_bias.to_device(device)?,
            norm: GatedRmsNorm {
                norm: norm(self.norm.norm)?,
                gate: self.norm.gate,
            },
            q_norm: ScaledRms {
                norm: norm(self.q_norm.norm)?,
            },
            k_norm: ScaledRms {
                norm: norm(self.k_norm.norm)?,
            },
            out_proj: self.out_proj.into_device(device, dtype)?,
            ..self
        })
    }

    /// The run's recurrence form and, on the device plan, its conv front.
    pub fn set_variants(&mut self, v: &crate::LayerVariants) {
        self.gdn_prefill = v.gdn_prefill;
        self.verify_window = v.verify_window;
        let device_plan = !matches!(self.out_proj.weight, crate::weights::Weight::Host(_));
        if device_plan {
            let (device, dtype) = (self.conv_taps.device().clone(), self.conv_taps.dtype());
            self.conv_front =
                ConvFront::for_layer(v.conv_front, &device, &self.conv_prep_dims(), dtype);
        }
    }

    /// Causal depthwise conv over `[conv_state; x]`, `x` `[B, S, C]`; keeps the last K−1 rows.
    fn conv(&self, x: &Tensor, cache: &mut GdnCache) -> Result<Tensor> {
        let (b, s, c) = x.dims3()?;
        let k = self.kernel;
        let prev = match &cache.conv {
            Some(p) => p.clone(),
            None => zeros((b, k - 1, c), x.dtype(), x.device())?,
        };
        let padded = cat(&[&prev, x], 1)?; // [B, S+K-1, C]
        if let Some(steps) = &mut cache.steps {
            steps.record_window(&padded, k - 1)?;
        }

        // A copy, not a view: the narrow is already contiguous, so `contiguous()` would keep
        // the whole `[B, S+K-1, C]` prefill buffer alive in every GDN layer.
        cache.conv = Some(candle_op(padded.narrow(1, s, k - 1)?.force_contiguous())?);
        let w = cast(&self.conv_taps, x.dtype())?;
        if s == 1 {
            // A decode step's window is all of `padded` ([B, K, C]): one product and one sum
            // over the taps instead of K products and K − 1 adds (launches, on a GPU).
            let products = candle_op(padded.broadcast_mul(&w))?;
            return candle_op(products.sum_keepdim(1));
        }
        let mut out = candle_op(padded.narrow(1, 0, s)?.broadcast_mul(&w.narrow(0, 0, 1)?))?;
        for m in 1..k {
            let tap = candle_op(padded.narrow(1, m, s)?.broadcast_mul(&w.narrow(0, m, 1)?))?;
            out = candle_op(out + tap)?;
        }
        Ok(out)
    }

    /// `x`: `[B, S, H]`.
    pub fn forward(&self, x: &Tensor, cache: &mut GdnCache) -> Result<Tensor> {
        let projected = self.project(x)?;
        let y = self.mix(&projected, cache)?;
        self.output(&y, &projected[1])
    }

    /// One decode step of several sequences, `x` `[1, B, H]`, row `i` the next token of the
    /// sequence whose state is `caches[i]`: the projections run once for all the rows (each
    /// weight read once), the conv and the recurrence per sequence on its own state.
    pub fn forward_batch(&self, x: &Tensor, caches: &mut [&mut GdnCache]) -> Result<Tensor> {
        let projected = self.project(x)?;
        let ys = caches
            .iter_mut()
            .enumerate()
            .map(|(i, cache)| {
                let row: Vec<Tensor> = projected
                    .iter()
                    .map(|p| p.narrow(1, i, 1))
                    .collect::<candle_core::Result<_>>()?;
                let row: [Tensor; 4] = row.try_into().expect("four projections");
                self.mix(&row, cache)
            })
            .collect::<Result<Vec<_>>>()?;
        self.output(&cat(&ys, 1)?, &projected[1])
    }

    /// `[qkv, z, b, a]` of `x` `[B, S, H]`.
    fn project(&self, x: &Tensor) -> Result<[Tensor; 4]> {
        labelled("gdn/in_proj", || {
            Ok(self
                .in_proj
                .forward(x)?
                .try_into()
                .expect("four projections"))
        })
    }

    /// The conv and the recurrence on the projections of one sequence's tokens: the
    /// recurrence's output `y` `[B, S, Hv, Dv]`, the state advanced in place.
    fn mix(&self, [qkv, _z, beta_in, a]: &[Tensor; 4], cache: &mut GdnCache) -> Result<Tensor> {
        let (b, s, _) = qkv.dims3()?;
        let (hk, hv, dk, dv) = (
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
        );
        let device = qkv.device();
        let (q, k, v, beta, g) = labelled("gdn/conv_prep", || {
            // A verify window (`cache.steps`) keeps its conv rows: the composed front does.
            if self.conv_front == ConvFront::Fused && cache.steps.is_none() {
                return self.conv_front_fused(qkv, beta_in, a, cache);
            }
            let conv = silu(&self.conv(qkv, cache)?)?;
            // Head views of the conv output: each is copied once, by the normalisation or here.
            let q = contiguous(&conv.narrow(D::Minus1, 0, hk * dk)?)?.reshape((b, s, hk, dk))?;
            let k =
                contiguous(&conv.narrow(D::Minus1, hk * dk, hk * dk)?)?.reshape((b, s, hk, dk))?;
            let v = contiguous(&conv.narrow(D::Minus1, 2 * hk * dk, hv * dv)?)?
                .reshape((b, s, hv, dv))?;
            let q = self.q_norm.norm.forward(&q)?;
            let k = self.k_norm.norm.forward(&k)?;
            let beta = sigmoid(&cast(beta_in, DType::F32)?)?;
            let g = decay(&cast(a, DType::F32)?, &self.dt_bias, &self.neg_a_log_exp)?;
            Ok((q, k, v, beta, g))
        })?;
        labelled("gdn/recurrence", || {
            let state = self.state_for(cache, b, device)?;
            let qkvgb = [&q, &k, &v, &g, &beta];
            match &mut cache.steps {
                // A verify window: the same call, one token at a time.
                Some(steps) => steps.recurrence(qkvgb, &state, |x, st| self.recurrence(x, st)),
                None => self.recurrence(qkvgb, &state),
            }
        })
    }

    /// The gated delta recurrence over `[q, k, v, g, beta]` (`[B, S, …]`) from `state`
    /// (advanced in place), in the form this layer was set to: the one call both a plain
    /// forward and a verify window's per-token steps make.
    fn recurrence(&self, [q, k, v, g, beta]: [&Tensor; 5], state: &Tensor) -> Result<Tensor> {
        match self.gdn_prefill {
            Some(form) => gdn_ops::gated_delta_update_in(form, q, k, v, g, beta, state, None),
            None => gdn_ops::gated_delta_update(q, k, v, g, beta, state),
        }
    }

    /// The gated output norm of `y` `[B, S, Hv, Dv]` by `z` `[B, S, Hv·Dv]`, then `out_proj`.
    fn output(&self, y: &Tensor, z: &Tensor) -> Result<Tensor> {
        let (b, s, _) = z.dims3()?;
        let (hv, dv) = (self.value_heads, self.value_dim);
        labelled("gdn/norm_out", || {
            let z = contiguous(z)?.reshape((b, s, hv, dv))?;
            let out = self.norm.forward(y, &z)?.reshape((b, s, hv * dv))?;
            self.out_proj
                .forward(&all_heads(self.shard.as_ref(), &out)?)
        })
    }
}

impl GatedDeltaNet {
    /// The recurrent state `[B, Hv, Dv, Dk]` the next call advances in place, kept in the
    /// cache: zeros on the first call; a state made in the other dtype is converted, never
    /// rejected.
    fn state_for(&self, cache: &mut GdnCache, b: usize, device: &Device) -> Result<Tensor> {
        let dtype = cache.state_dtype.dtype();
        let state = match &cache.state {
            Some(st) if st.dtype() == dtype => st.clone(),
            Some(st) => cast(st, dtype)?,
            None => {
                let (hv, dv, dk) = (self.value_heads, self.value_dim, self.key_dim);
                zeros((b, hv, dv, dk), dtype, device)?
            }
        };
        cache.state = Some(state.clone());
        Ok(state)
    }
}

/// `g = exp(−exp(A_log) · softplus(a + dt_bias))` in f32: the per-token decay in (0, 1].
fn decay(a: &Tensor, dt_bias: &Tensor, neg_a_log_exp: &Tensor) -> Result<Tensor> {
    let x = candle_op(a.broadcast_add(dt_bias))?;
    // softplus(x) = max(x, 0) + log(1 + exp(−|x|)), stable for large |x|.
    let relu = candle_op(x.relu())?;
    let abs = candle_op(x.abs())?;
    let neg = candle_op(abs.neg())?;
    let exp = candle_op(neg.exp())?;
    let one_plus = candle_op(exp + 1.0)?;
    let log = candle_op(one_plus.log())?;
    let softplus = candle_op(relu + log)?;
    let scaled = candle_op(softplus.broadcast_mul(neg_a_log_exp))?;
    candle_op(scaled.exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_next_row_permutation() {
        // Hk=2, Dk=1, r·Dv=2: groups [q k v v z z], [q k v v z z].
        assert_eq!(
            qkvz_rows(2, 1, 2),
            vec![0, 6, 1, 7, 2, 3, 8, 9, 4, 5, 10, 11]
        );
        // Hk=2, r=2: [b b a a], [b b a a].
        assert_eq!(ba_rows(2, 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
    }
}
