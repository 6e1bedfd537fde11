//! The hyper-connections of `qwen4_exp` (docs/qwen4_exp.md §3): the residual is `S` streams
//! of `H`; a learned low-rank mixer turns them into the block's input, and the block's output
//! is added back to each stream with its own gate. The model's last one (without gates)
//! replaces the final norm. Composed candle ops in the activation dtype (f32 on the
//! reference plan); a fused decode step runs the norm, the injection and the mixing on the
//! `hyper_connection` kernels of gdn-ops ([`HyperConnection::normed`],
//! [`HyperConnection::mix_normed`], [`HyperConnection::inject_normed`]), the products
//! between them on the affine kernels, with [`HyperConnection::forward`] and
//! [`HyperConnection::inject`] as their reference. The down and injection products read the
//! same normed streams and are one merged product ([`HyperConnection::down_and_gates`]); the
//! activation, the up product and the mixing are one kernel (`hc_up_mix`) where it covers the
//! quantized up matrix.

use crate::candle_ops::{sigmoid, silu};
use crate::layers::linear::{FusedLinear, Linear};
use crate::weights::Checkpoint;
use crate::weights::Weight;
use crate::Config;
use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::candle_op;
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::hyper_connection::{
    hc_act, hc_inject_norm, hc_inject_slots_norm, hc_mix, hc_up_mix, supports_up_mix,
};

/// RMSNorm applied to each group of `group` features separately, with a zero-centred weight
/// (`1 + w`): the norm of the hyper-connections and of the per-layer embeddings. Neither the
/// HF nor the mlx-vlm layout stores `1 + w` for it ([`Checkpoint::centred_norm`]).
#[derive(Debug, Clone)]
pub struct GroupedRmsNorm {
    /// `1 + w`, shaped `[groups, group]`.
    pub weight: Tensor,
    pub eps: f64,
}

impl GroupedRmsNorm {
    /// `name` is the canonical tensor name of the zero-centred weight `[groups · group]`.
    pub fn load(
        ckpt: &Checkpoint,
        name: &str,
        groups: usize,
        group: usize,
        eps: f64,
    ) -> Result<Self> {
        let w = ckpt.centred_norm(name, &[groups * group], &Device::Cpu)?;
        Ok(Self {
            weight: candle_op(w.reshape((groups, group)))?,
            eps,
        })
    }

    /// The device plan's copy: the weight on `device`, kept in f32 (the norm computes in
    /// f32 whatever the activation dtype).
    pub fn into_device(self, device: &Device) -> Result<Self> {
        Ok(Self {
            weight: self.weight.to_device(device)?,
            eps: self.eps,
        })
    }

    /// `x`: `[T, groups · group]` → same shape and dtype (computed in f32).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (groups, group) = self.weight.dims2()?;
        let t = x.dim(0)?;
        let dtype = x.dtype();
        let x = candle_op(x.to_dtype(DType::F32)?.reshape((t, groups, group)))?;
        let ms = candle_op(candle_op(x.sqr())?.mean_keepdim(D::Minus1))?;
        let inv = candle_op(candle_op((ms + self.eps)?.sqrt())?.recip())?;
        let y = candle_op(x.broadcast_mul(&inv))?;
        let y = candle_op(y.broadcast_mul(&self.weight.to_dtype(y.dtype())?))?;
        candle_op(y.reshape((t, groups * group))?.to_dtype(dtype))
    }
}

/// One `GatedResidual`: `attn_hyper_connection`, `mlp_hyper_connection` (with injection
/// weights) or `hyper_connection_mixer` (without).
#[derive(Debug, Clone)]
pub struct HyperConnection {
    pub norm: GroupedRmsNorm,
    /// The down product `[R, S·H]` and, with injection weights, the injection product
    /// `[S, S·H]` after it: both read the normed streams, so they are one matrix (merged
    /// at load when their quantization matches) and one launch, the outputs narrowed views
    /// of its `[T, R + S]` (see [`Self::down_and_gates`]).
    pub down_inject: FusedLinear,
    /// `[S·H, R]`.
    pub up: Linear,
    pub streams: usize,
    pub hidden: usize,
}

impl HyperConnection {
    /// `module`: canonical prefix, e.g. `model.layers.3.attn_hyper_connection`.
    pub fn load(
        ckpt: &Checkpoint,
        module: &str,
        config: &Config,
        with_inject: bool,
    ) -> Result<Self> {
        let q = config
            .qwen4_exp
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("hyper-connections need a qwen4_exp config"))?;
        let (s, h, r) = (q.hc_count, config.hidden_size, q.hc_lowrank);
        let width = s * h;
        let mut down_inject = vec![Linear::load(
            ckpt,
            &format!("{module}.input_mix_weight_down"),
            r,
            width,
            config,
        )?];
        if with_inject {
            down_inject.push(Linear::load(
                ckpt,
                &format!("{module}.block_inject_weight"),
                s,
                width,
                config,
            )?);
        }
        Ok(Self {
            norm: GroupedRmsNorm::load(
                ckpt,
                &format!("{module}.hc_norm.weight"),
                s,
                h,
                config.rms_norm_eps,
            )?,
            down_inject: FusedLinear::new(down_inject),
            up: Linear::load(
                ckpt,
                &format!("{module}.input_mix_weight_up"),
                width,
                r,
                config,
            )?,
            streams: s,
            hidden: h,
        })
    }

    /// The device plan's copy (products on `device` in `dtype`).
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            norm: self.norm.into_device(device)?,
            down_inject: self.down_inject.into_device(device, dtype)?,
            up: self.up.into_device(device, dtype)?,
            streams: self.streams,
            hidden: self.hidden,
        })
    }

    /// `hs`: `[T, S·H]` → the block's input `[T, H]` and, with injection weights, the
    /// per-stream gates `[T, S]` (`2 · sigmoid(·/S)`).
    pub fn forward(&self, hs: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let (t, width) = hs.dims2()?;
        ensure!(
            width == self.streams * self.hidden,
            "hyper-connection input has {width} features, expected {}",
            self.streams * self.hidden
        );
        let s = self.streams as f64;
        let n = self.norm.forward(hs)?;
        let (d, g) = self.down_and_gates(&n)?;
        let a = silu(&candle_op(d / s)?)?;
        let m = sigmoid(&self.up.forward(&a)?)?;
        let mixed = candle_op(m.mul(&n))?;
        let x =
            candle_op(candle_op(mixed.reshape((t, self.streams, self.hidden)))?.mean(D::Minus2))?;
        let w = match g {
            Some(g) => {
                let g = candle_op(g / s)?;
                Some(candle_op(sigmoid(&g)? * 2.0)?)
            }
            None => None,
        };
        Ok((x, w))
    }

    /// Whether this hyper-connection has injection weights (all but the final mixer).
    pub fn has_inject(&self) -> bool {
        self.down_inject.out_dims().len() == 2
    }

    /// The down product `[T, R]` of the normed streams `n` `[T, S·H]` and, with injection
    /// weights, the injection product's gate logits `[T, S]`: one merged product, its outputs
    /// narrowed views (contiguous at one token, so the fused kernels read them in place).
    pub fn down_and_gates(&self, n: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let mut outs = self.down_inject.forward(n)?.into_iter();
        let d = outs
            .next()
            .ok_or_else(|| anyhow::anyhow!("hyper-connection without a down product"))?;
        Ok((d, outs.next()))
    }

    /// Whether the fused kernels cover this hyper-connection's streams in `dtype`.
    pub fn fused_supported(&self, dtype: DType) -> bool {
        gdn_ops::ops::hyper_connection::supports(self.streams, self.hidden, dtype)
    }

    /// The grouped norm of `hs` `[T, S·H]` on the fused kernel (one launch): the first step
    /// of [`Self::forward`].
    pub fn normed(&self, hs: &Tensor) -> Result<Tensor> {
        let (_, normed) = hc_inject_norm(hs, None, Some(self.norm_args()), self.streams)?;
        normed.ok_or_else(|| anyhow::anyhow!("hc_inject_norm returned no normed streams"))
    }

    /// A block's output `y` `[T, H]` injected into `hs` with the gate logits `g` `[T, S]`
    /// (from [`Self::mix_normed`]), and, when `next` is given, the next hyper-connection's
    /// norm of the result, on one fused kernel: `(streams, next's normed streams)`. The
    /// fused form of [`Self::inject`] followed by `next`'s norm.
    pub fn inject_normed(
        hs: &Tensor,
        y: &Tensor,
        g: &Tensor,
        next: Option<&HyperConnection>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let streams = g.dim(1)?;
        hc_inject_norm(hs, Some((y, g)), next.map(|n| n.norm_args()), streams)
    }

    /// [`Self::inject_normed`] of a fused MoE block's output given by its slots: `down`
    /// `[T, K, H]` and their f32 routing weights `[T, K]`, summed in the same launch (the
    /// `moe_combine` launch it replaces).
    pub fn inject_slots_normed(
        hs: &Tensor,
        (down, weights): (&Tensor, &Tensor),
        g: &Tensor,
        next: Option<&HyperConnection>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let streams = g.dim(1)?;
        hc_inject_slots_norm(hs, (down, weights, g), next.map(|n| n.norm_args()), streams)
    }

    /// The rest of [`Self::forward`] from the normed streams `n` `[T, S·H]` (from
    /// [`Self::normed`] or [`Self::inject_normed`]): the block's input `[T, H]` (the merged
    /// down and inject product on the affine kernels, then the activation, the up product
    /// and the mixing on `hc_up_mix`, or where it does not cover the up matrix on `hc_act`,
    /// the product and `hc_mix`) and, with injection weights, the injection product's gate
    /// logits `[T, S]` before their sigmoid, which [`Self::inject_normed`] applies.
    pub fn mix_normed(&self, n: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let (d, g) = self.down_and_gates(n)?;
        let x = match self.up_mix_matrix(n.dtype()) {
            Some(up) => hc_up_mix(&d, up, n, self.streams)?,
            None => {
                if !n.device().is_cpu() {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| {
                        eprintln!(
                            "note: no hc_up_mix kernel for this hyper-connection's up matrix; \
                             using hc_act, the product and hc_mix"
                        )
                    });
                }
                let a = hc_act(&d, self.streams)?;
                hc_mix(&self.up.forward(&a)?, n, self.streams)?
            }
        };
        Ok((x, g))
    }

    /// The up matrix when `hc_up_mix` covers it in `dtype` (quantized, without bias, a shape
    /// and width of its kernels); `None` keeps `hc_act`, the product and `hc_mix`.
    pub fn up_mix_matrix(&self, dtype: DType) -> Option<&AffineTensor> {
        match (&self.up.weight, &self.up.bias) {
            (Weight::Quantized(up), None)
                if supports_up_mix(up, self.streams, self.hidden, dtype) =>
            {
                Some(up)
            }
            _ => None,
        }
    }

    fn norm_args(&self) -> (&Tensor, f32) {
        (&self.norm.weight, self.norm.eps as f32)
    }

    /// `hs + concat_s(w[s] · y)`: the block output `y` `[T, H]` added to every stream of the
    /// (un-normalised) residual `hs` `[T, S·H]` with its gate `w` `[T, S]`.
    pub fn inject(hs: &Tensor, y: &Tensor, w: &Tensor) -> Result<Tensor> {
        let (t, s) = w.dims2()?;
        let h = y.dim(1)?;
        let y = candle_op(y.reshape((t, 1, h)))?;
        let w = candle_op(w.reshape((t, s, 1)))?;
        let add = candle_op(candle_op(y.broadcast_mul(&w))?.reshape((t, s * h)))?;
        candle_op(hs.add(&add))
    }
}
