//! Bytes a decoded token moves, from config.json alone: the active weights (only the routed
//! experts), the GDN states read and written, and the KV cache read. Over a device's memory
//! bandwidth this is the decode roofline; docs/metal.md gives it for Qwen3-Next-80B-A3B.
//!
//! The layout assumed is mlx-community's: quantized matrices as `config.json` declares them
//! (per-module overrides first), bf16 scales, biases and float tensors, except Qwen3.5's
//! `A_log`, kept in f32.

use crate::config::{Family, LayerKind, QuantSpec};
use crate::{Config, StateDtype};

/// Byte counts for one decoded token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeFootprint {
    /// Weights one token reads: every dense matrix, the router's top-k experts, the head.
    pub active_weights: usize,
    /// Every weight byte of the checkpoint (all experts): its size on disk, less metadata.
    pub all_weights: usize,
    /// GDN recurrent states read and written, plus the conv states.
    pub gdn_state: usize,
    /// Keys and values read at the given context length (plus the new position written).
    pub kv_cache: usize,
}

impl DecodeFootprint {
    /// A weight of `bytes`, of which the fraction `num / den` is read per token.
    fn add(&mut self, bytes: usize, (num, den): (usize, usize)) {
        self.all_weights += bytes;
        self.active_weights += bytes * num / den;
    }

    pub fn total(&self) -> usize {
        self.active_weights + self.gdn_state + self.kv_cache
    }

    /// Decoding at `context` cached positions, states in `state`, a bf16 KV cache.
    pub fn of(cfg: &Config, context: usize, state: StateDtype) -> Self {
        let mut f = Self::default();
        let bf16 = 2;
        let prefix = match cfg.family {
            Family::Qwen3Next => "model",
            Family::Qwen35 => "language_model.model",
        };
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let always = (1, 1);
        let matrix = |module: &str, rows: usize, cols: usize| -> usize {
            let spec = cfg.quant_spec_for(module).unwrap_or(cfg.quantization);
            matrix_bytes(spec, rows, cols)
        };
        // The embedding table: one row per token.
        let embed = matrix(&format!("{prefix}.embed_tokens"), v, h);
        f.add(embed, (1, v));
        if !cfg.tie_word_embeddings {
            f.add(matrix("lm_head", v, h), always);
        } else {
            f.active_weights += embed;
        }
        f.add(h * bf16, always); // final norm
        for i in 0..cfg.num_hidden_layers {
            let p = format!("{prefix}.layers.{i}");
            f.add(2 * h * bf16, always); // input and post-attention norms
            match cfg.layer_kind(i) {
                LayerKind::LinearAttention => {
                    let a = format!("{p}.linear_attn");
                    let (hv, dv, dk) = (
                        cfg.linear_num_value_heads,
                        cfg.linear_value_head_dim,
                        cfg.linear_key_head_dim,
                    );
                    let (conv, vd) = (cfg.conv_dim(), cfg.value_dim());
                    match cfg.family {
                        Family::Qwen3Next => {
                            f.add(matrix(&format!("{a}.in_proj_qkvz"), conv + vd, h), always);
                            f.add(matrix(&format!("{a}.in_proj_ba"), 2 * hv, h), always);
                        }
                        Family::Qwen35 => {
                            f.add(matrix(&format!("{a}.in_proj_qkv"), conv, h), always);
                            f.add(matrix(&format!("{a}.in_proj_z"), vd, h), always);
                            f.add(matrix(&format!("{a}.in_proj_b"), hv, h), always);
                            f.add(matrix(&format!("{a}.in_proj_a"), hv, h), always);
                        }
                    }
                    f.add(matrix(&format!("{a}.out_proj"), h, vd), always);
                    let k = cfg.linear_conv_kernel_dim;
                    let a_log = if cfg.family == Family::Qwen35 {
                        4
                    } else {
                        bf16
                    };
                    f.add(conv * k * bf16 + hv * (a_log + bf16) + dv * bf16, always);
                    let st = state.dtype().size_in_bytes();
                    f.gdn_state += 2 * hv * dv * dk * st + 2 * (k - 1) * conv * bf16;
                }
                LayerKind::FullAttention => {
                    let a = format!("{p}.self_attn");
                    let (nq, nkv, dh) = (
                        cfg.num_attention_heads,
                        cfg.num_key_value_heads,
                        cfg.head_dim,
                    );
                    f.add(matrix(&format!("{a}.q_proj"), 2 * nq * dh, h), always);
                    f.add(matrix(&format!("{a}.k_proj"), nkv * dh, h), always);
                    f.add(matrix(&format!("{a}.v_proj"), nkv * dh, h), always);
                    f.add(matrix(&format!("{a}.o_proj"), h, nq * dh), always);
                    f.add(2 * dh * bf16, always); // q and k norms
                    f.kv_cache += 2 * nkv * dh * bf16 * (context + 1);
                }
            }
            let m = format!("{p}.mlp");
            if cfg.is_moe_layer(i) {
                let (e, k, im, is) = (
                    cfg.num_experts,
                    cfg.num_experts_per_tok,
                    cfg.moe_intermediate_size,
                    cfg.shared_expert_intermediate_size,
                );
                f.add(matrix(&format!("{m}.gate"), e, h), always);
                let experts = format!("{m}.switch_mlp");
                for (proj, rows, cols) in [
                    ("gate_proj", im, h),
                    ("up_proj", im, h),
                    ("down_proj", h, im),
                ] {
                    f.add(e * matrix(&format!("{experts}.{proj}"), rows, cols), (k, e));
                }
                if is > 0 {
                    let s = format!("{m}.shared_expert");
                    f.add(matrix(&format!("{s}.gate_proj"), is, h), always);
                    f.add(matrix(&format!("{s}.up_proj"), is, h), always);
                    f.add(matrix(&format!("{s}.down_proj"), h, is), always);
                    f.add(matrix(&format!("{m}.shared_expert_gate"), 1, h), always);
                }
            } else {
                let im = cfg.intermediate_size;
                f.add(matrix(&format!("{m}.gate_proj"), im, h), always);
                f.add(matrix(&format!("{m}.up_proj"), im, h), always);
                f.add(matrix(&format!("{m}.down_proj"), h, im), always);
            }
        }
        f
    }
}

/// One `[rows, cols]` matrix: packed words plus bf16 scales and biases, or bf16 values.
fn matrix_bytes(spec: Option<QuantSpec>, rows: usize, cols: usize) -> usize {
    match spec {
        Some(q) => rows * cols * q.bits / 8 + 2 * 2 * rows * (cols / q.group_size),
        None => 2 * rows * cols,
    }
}
