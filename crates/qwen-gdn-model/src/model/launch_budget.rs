//! Kernel launches of one decode step, per layer kind: measured on a (tiny) model by counting
//! where the kernels are launched, then scaled to another config with the same layer kinds
//! (the count depends on the layer structure, not the widths).

use super::Model;
use crate::config::LayerKind;
use crate::Config;
use anyhow::{Context, Result};

/// Launches of one decode step: outside the layers, per GDN layer and per attention layer
/// (for `qwen4_exp`: a GDN layer without a per-layer embedding, a QSA layer, each with its
/// hyper-connections), and what a per-layer embedding adds to its layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchBudget {
    pub outside: usize,
    pub gdn_layer: usize,
    pub attention_layer: usize,
    /// `qwen4_exp`: the launches of a PLE block (0 for the other families).
    pub ple: usize,
    /// `qwen4_exp` with the fused hyper-connections: the launch a layer saves when the
    /// previous layer's last launch computed its first norm (every layer but the first and
    /// the PLE layers, [`carried_norm_layers`]); the per-layer counts above are of a layer
    /// that computes its own. 0 for the other families.
    pub carried_norm: usize,
}

impl LaunchBudget {
    /// One decode step after a short prefill (fused or composed, as `model` is set), each
    /// layer kind taken from the model's first layer of that kind.
    pub fn measure(model: &Model) -> Result<Self> {
        let mut cache = model.new_cache();
        model.prefill(&[1, 2, 3, 4, 5], &mut cache, 16)?;
        gdn_ops::launches::take();
        let (_, mut per_layer) = model.decode_step_with_launches(6, &mut cache)?;
        let outside = gdn_ops::launches::take() - per_layer.iter().sum::<usize>();
        let carried_norm = match model.qwen4_exp() {
            Some(d) if model.fused_decode() && d.fused_hyper_connections() => 1,
            _ => 0,
        };
        for i in carried_norm_layers(model.config()) {
            per_layer[i] += carried_norm;
        }
        let ple_layers = ple_layers(model.config());
        let first_of = |kind: LayerKind, ple: bool, what: &str| {
            (0..per_layer.len())
                .find(|&i| model.config().layer_kind(i) == kind && ple_layers.contains(&i) == ple)
                .map(|i| per_layer[i])
                .with_context(|| format!("no {what} layer in the measured model"))
        };
        let gdn_layer = first_of(LayerKind::LinearAttention, false, "GDN")?;
        let ple = if ple_layers.is_empty() {
            0
        } else {
            first_of(LayerKind::LinearAttention, true, "per-layer embedding")? - gdn_layer
        };
        Ok(Self {
            outside,
            gdn_layer,
            attention_layer: first_of(LayerKind::FullAttention, false, "attention")?,
            ple,
            carried_norm,
        })
    }

    /// `(GDN layers, attention layers)` of `config`.
    pub fn layers_of(config: &Config) -> (usize, usize) {
        let attention = (0..config.num_hidden_layers)
            .filter(|&i| config.layer_kind(i) == LayerKind::FullAttention)
            .count();
        (config.num_hidden_layers - attention, attention)
    }

    /// Launches of one decode step of `config`.
    pub fn total_for(&self, config: &Config) -> usize {
        let (gdn, attention) = Self::layers_of(config);
        self.outside
            + gdn * self.gdn_layer
            + attention * self.attention_layer
            + ple_layers(config).len() * self.ple
            - carried_norm_layers(config).len() * self.carried_norm
    }
}

/// The `qwen4_exp` layers whose attention hyper-connection's norm the previous layer's MoE
/// injection computes in a fused step: all but the first and the PLE layers (a PLE layer
/// adds its embedding between the two). Empty for the other families.
pub fn carried_norm_layers(config: &Config) -> Vec<usize> {
    if config.qwen4_exp.is_none() {
        return Vec::new();
    }
    let ple = ple_layers(config);
    (1..config.num_hidden_layers)
        .filter(|i| !ple.contains(i))
        .collect()
}

/// The zero-based layers with a `qwen4_exp` per-layer embedding.
pub fn ple_layers(config: &Config) -> Vec<usize> {
    config
        .qwen4_exp
        .as_ref()
        .and_then(|q| q.ple.as_ref())
        .map_or_else(Vec::new, |p| p.layers.clone())
}
