//! The GDN mixer's decode step on fused kernels: after the merged in-projection, one kernel
//! for the conv (with its state), SiLU, the q/k L2 norms, the decay and β
//! (`gdn_conv_prep`), one for the recurrence with the gated RMSNorm applied to its output
//! (`gated_delta_update_norm`, the state advanced in place in its own dtype), and the
//! out-projection. The fused norm takes the layer's gate: SiLU (Qwen3-Next, Qwen3.5) or
//! sigmoid (`qwen4_exp`'s `output_gate_type: sigmoid`).
//! [`GatedDeltaNet::forward`] is the composed path these kernels are tested against.

use super::GatedDeltaNet;
use crate::cache::GdnCache;
use crate::candle_ops::cat;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::{
    gated_delta, gated_delta_norm, gated_delta_norm_slots, gdn_conv_prep, gdn_conv_prep_slots,
};
use gdn_ops::profile;
use gdn_ops::GdnDims;

impl GatedDeltaNet {
    /// The dims of one decode step's recurrence.
    fn step_dims(&self) -> GdnDims {
        GdnDims {
            batch: 1,
            steps: 1,
            key_heads: self.key_heads,
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
        }
    }

    /// Whether the composed step's recurrence runs on `device` itself (not on the host, as
    /// it does on CUDA for key head dims no kernel covers): a CUDA graph can then hold it.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph's question
    pub(crate) fn recurrence_on_device(&self, device: &Device) -> bool {
        gated_delta::runs_on_device(device, &self.step_dims())
    }

    /// Whether the fused kernels cover this layer in `dtype`.
    pub(crate) fn fused_decode_supported(&self, dtype: DType) -> bool {
        let recurrence = self.step_dims();
        // Either state dtype: the cache may switch it between calls.
        gdn_conv_prep::supports(&self.conv_prep_dims(), dtype)
            && [DType::F32, DType::BF16]
                .iter()
                .all(|&state| gated_delta_norm::supports(&recurrence, dtype, state))
    }

    pub(super) fn conv_prep_dims(&self) -> gdn_conv_prep::ConvPrepDims {
        gdn_conv_prep::ConvPrepDims {
            key_heads: self.key_heads,
            key_dim: self.key_dim,
            value_heads: self.value_heads,
            value_dim: self.value_dim,
            kernel_size: self.kernel,
        }
    }

    /// The fused conv front (`gdn_conv_prep`) on this layer's taps, decay parameters and dims:
    /// `qkv` `[B, S, C]`, `b` and `a` `[B, S, Hv]`, `conv_state` `[B, K−1, C]`.
    pub(super) fn conv_prep(
        &self,
        qkv: &Tensor,
        b: &Tensor,
        a: &Tensor,
        conv_state: &Tensor,
    ) -> Result<gdn_conv_prep::ConvPrepOut> {
        gdn_conv_prep::gdn_conv_prep(
            qkv,
            b,
            a,
            conv_state,
            &self.conv_taps,
            &self.dt_bias,
            &self.neg_a_log_exp,
            self.conv_prep_dims(),
        )
    }

    /// One token per sequence: `x` `[B, H]` (input-normed) → the mixer's output `[B, H]`.
    pub(crate) fn decode_fused(&self, x: &Tensor, cache: &mut GdnCache) -> Result<Tensor> {
        let parts = self.decode_in_proj(x)?;
        let out = self.decode_mix_fused(&parts, cache)?;
        self.decode_out_proj(&out)
    }

    /// The merged in-projection of [`GatedDeltaNet::decode_fused`]: `x` `[B, H]` →
    /// `[qkv, z, b, a]`, each `[B, ·]` (one product for every row of a batched step).
    pub(crate) fn decode_in_proj(&self, x: &Tensor) -> Result<[Tensor; 4]> {
        Ok(
            profile::labelled("gdn.in_proj", || self.in_proj.forward(x))?
                .try_into()
                .expect("four projections"),
        )
    }

    /// The out-projection of [`GatedDeltaNet::decode_fused`]: `[B, Hv·Dv]` → `[B, H]`.
    pub(crate) fn decode_out_proj(&self, out: &Tensor) -> Result<Tensor> {
        profile::labelled("gdn.out_proj", || self.out_proj.forward(out))
    }

    /// The fused conv front and recurrence on the in-projection's `parts` (rows of the
    /// sequences `cache` holds): the normed, gated recurrence output `[B, Hv·Dv]`.
    pub(crate) fn decode_mix_fused(
        &self,
        [qkv, z, beta_in, a]: &[Tensor; 4],
        cache: &mut GdnCache,
    ) -> Result<Tensor> {
        let b = qkv.dim(0)?;
        let (hv, dv) = (self.value_heads, self.value_dim);
        let channels = qkv.dim(1)?;
        let conv_state = self.conv_state_for(cache, b, channels, qkv)?;
        let state = self.state_for(cache, b, qkv.device())?;
        let prepared = self.conv_prep(qkv, beta_in, a, &conv_state)?;
        let (q, k, v, g, beta) = (
            &prepared.q,
            &prepared.k,
            &prepared.v,
            &prepared.g,
            &prepared.beta,
        );
        let z = z.reshape((b, 1, hv, dv))?;
        let (weight, eps) = (&self.norm.norm.weight, self.norm.norm.eps);
        let out = gated_delta_norm::gated_delta_update_norm(
            q,
            k,
            v,
            g,
            beta,
            &state,
            &z,
            weight,
            eps,
            self.norm.gate,
        )?;
        Ok(out.reshape((b, hv * dv))?)
    }

    /// The fused conv front and recurrence of a batched step: row `r` of `parts` belongs to
    /// the sequence `caches[r]` holds. Where the device has the slot kernels
    /// (`gdn_conv_prep_slots`, `gated_delta_update_norm_slots`: the CPU twins, CUDA) each runs
    /// once for all rows, every sequence on its own conv and recurrent state; elsewhere
    /// (Metal) [`GatedDeltaNet::decode_mix_fused`] runs per row. Either way each row's output
    /// is its sequence's single-sequence step's, bit for bit. Returns `[B, Hv·Dv]`.
    pub(crate) fn decode_mix_fused_rows(
        &self,
        parts: &[Tensor; 4],
        caches: &mut [&mut GdnCache],
    ) -> Result<Tensor> {
        let [qkv, z, beta_in, a] = parts;
        if !gdn_ops::slot_tables::supports_device(qkv.device()) {
            let mut outs = Vec::with_capacity(caches.len());
            for (row, cache) in caches.iter_mut().enumerate() {
                let part = |t: &Tensor| t.narrow(0, row, 1);
                let row_parts = [part(qkv)?, part(z)?, part(beta_in)?, part(a)?];
                outs.push(self.decode_mix_fused(&row_parts, cache)?);
            }
            return cat(&outs, 0);
        }
        let rows = qkv.dim(0)?;
        let (hv, dv) = (self.value_heads, self.value_dim);
        let channels = qkv.dim(1)?;
        let mut conv_states = Vec::with_capacity(rows);
        let mut states = Vec::with_capacity(rows);
        for cache in caches.iter_mut() {
            conv_states.push(self.conv_state_for(cache, 1, channels, qkv)?);
            states.push(self.state_for(cache, 1, qkv.device())?);
        }
        let prepared = gdn_conv_prep_slots::gdn_conv_prep_slots(
            qkv,
            beta_in,
            a,
            &conv_states,
            &self.conv_taps,
            &self.dt_bias,
            &self.neg_a_log_exp,
            self.conv_prep_dims(),
        )?;
        let z = z.reshape((rows, 1, hv, dv))?;
        let (weight, eps) = (&self.norm.norm.weight, self.norm.norm.eps);
        let out = gated_delta_norm_slots::gated_delta_update_norm_slots(
            &prepared.q,
            &prepared.k,
            &prepared.v,
            &prepared.g,
            &prepared.beta,
            &states,
            &z,
            weight,
            eps,
            self.norm.gate,
        )?;
        Ok(out.reshape((rows, hv * dv))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::hybrid::Mixer;
    use crate::layers::norm::Gate;
    use crate::tensor::max_abs;
    use crate::{Model, Plan, RunOptions};
    use candle_core::Device;

    /// The fused GDN decode step against the composed one, with the layer's output gate
    /// (SiLU, then the sigmoid that `qwen4_exp` configures), over several steps of random
    /// inputs: a GDN layer of the Qwen3.5 fixture, whose widths the kernels cover (the
    /// `qwen4_exp` fixture's head dims of 16 are not). Fails when the fused arm applies the
    /// wrong gate, or when a gate costs launches the other does not (a composed norm).
    #[test]
    fn fused_decode_matches_composed_for_each_output_gate() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/qwen3.5-tiny-4bit");
        let opts = RunOptions {
            dtype: DType::F32,
            plan: Some(Plan::Device),
            ..RunOptions::default()
        };
        let model = Model::load(&dir, &Device::Cpu, &opts).unwrap();
        let mut gdn = model
            .layers()
            .iter()
            .find_map(|l| match &l.mixer {
                Mixer::Gdn(m) => Some(m.clone()),
                Mixer::Attention(_) => None,
            })
            .unwrap();
        assert!(gdn.fused_decode_supported(DType::F32));
        let hidden = model.config().hidden_size;
        let (mut outputs, mut launches) = (Vec::new(), Vec::new());
        for gate in [Gate::Silu, Gate::Sigmoid] {
            gdn.norm.gate = gate;
            let (mut fused_cache, mut composed_cache) = (GdnCache::default(), GdnCache::default());
            let mut fused_rows = Vec::new();
            for step in 0..4u64 {
                let x = Tensor::randn(0f32, 1., (1, hidden), &Device::Cpu).unwrap();
                gdn_ops::launches::take();
                let fused = gdn.decode_fused(&x, &mut fused_cache).unwrap();
                launches.push((gate, gdn_ops::launches::take()));
                let composed = gdn
                    .forward(&x.unsqueeze(1).unwrap(), &mut composed_cache)
                    .unwrap()
                    .squeeze(1)
                    .unwrap();
                let scale = max_abs(&composed);
                let d = max_abs(&(&fused - &composed).unwrap());
                assert!(
                    d <= 1e-5 * scale.max(1.),
                    "{gate:?} step {step}: {d:e} of {scale:e}"
                );
                fused_rows.push(fused);
            }
            outputs.push(Tensor::cat(&fused_rows, 0).unwrap());
        }
        // The gates give different outputs, so a swapped gate cannot pass.
        let apart = max_abs(&(&outputs[0] - &outputs[1]).unwrap());
        assert!(apart > 1e-3, "{apart:e}");
        // Both gates run the same kernels step by step (the first step also allocates the
        // states): the sigmoid takes no composed norm.
        let (silu, sigmoid) = launches.split_at(launches.len() / 2);
        assert!(
            silu.iter().zip(sigmoid).all(|(a, b)| a.1 == b.1 && a.1 > 0),
            "{launches:?}"
        );
    }
}
