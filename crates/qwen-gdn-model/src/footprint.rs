//! Bytes a decoded token moves, from config.json alone: the active weights (only the routed
//! experts), the GDN states read and written, and the KV cache read. Over a device's memory
//! bandwidth this is the decode roofline; docs/metal.md gives it for Qwen3-Next-80B-A3B.
//!
//! The layout assumed is mlx-community's (mlx-vlm's for `qwen4_exp`): quantized matrices as
//! `config.json` declares them (per-module overrides first), bf16 scales, biases and float
//! tensors, except Qwen3.5's `A_log`, kept in f32.
//!
//! `qwen4_exp` (docs/qwen4_exp.md §7) has no per-layer or final norms; it has two
//! hyper-connections per layer and a final mixer, the QSA indexer's projection and norms, and
//! on its PLE layers the key/value projections, three norms, a conv, an n-gram table (of
//! which a token reads one row per hashed head) and its conv window (state, read and written).
//! Its attention is counted as the device plan runs it today: the masked attention reads
//! every cached key and value, and the indexer's f32 block keys are read on the host.

use crate::config::qwen4_exp::{PleConfig, Qwen4ExpConfig};
use crate::config::{Family, LayerKind, QuantSpec};
use crate::families::qwen4_exp::ngram_hash::NgramHash;
use crate::{Config, StateDtype};

/// Byte counts for one decoded token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeFootprint {
    /// Weights one token reads: every dense matrix, the router's top-k experts, the head.
    pub active_weights: usize,
    /// Every weight byte of the checkpoint the model holds in memory (all experts): its size
    /// on disk, less metadata and the n-gram tables.
    pub all_weights: usize,
    /// `qwen4_exp`'s n-gram tables (and their hash-constant buffers): gathered row by row
    /// from the mapped files, never held in (device) memory. The rows a token reads are in
    /// `active_weights`.
    pub ngram_tables: usize,
    /// GDN recurrent states read and written, plus the conv states (and `qwen4_exp`'s PLE
    /// conv windows, read and written).
    pub gdn_state: usize,
    /// Keys and values read at the given context length (plus the new position written);
    /// for `qwen4_exp` also the QSA indexer's block keys.
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
        let q4 = cfg.qwen4_exp.as_ref();
        match q4 {
            // The final mixer replaces the final norm.
            Some(q) => f.add(
                hyper_connection(
                    q,
                    h,
                    &format!("{prefix}.hyper_connection_mixer"),
                    false,
                    &matrix,
                ),
                always,
            ),
            None => f.add(h * bf16, always), // final norm
        }
        for i in 0..cfg.num_hidden_layers {
            let p = format!("{prefix}.layers.{i}");
            match q4 {
                Some(q) => {
                    for (hc, inject) in [
                        ("attn_hyper_connection", true),
                        ("mlp_hyper_connection", true),
                    ] {
                        f.add(
                            hyper_connection(q, h, &format!("{p}.{hc}"), inject, &matrix),
                            always,
                        );
                    }
                    if let Some(ple) = q.ple.as_ref() {
                        if let Some(index) = ple.layers.iter().position(|&l| l == i) {
                            f.per_layer_embedding(cfg, q, ple, index, &format!("{p}.ple"), &matrix);
                        }
                    }
                }
                None => f.add(2 * h * bf16, always), // input and post-attention norms
            }
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
                    if let Some(qsa) = q4.and_then(|q| q.qsa) {
                        let (n, di) = (qsa.n_heads, qsa.head_dim);
                        f.add(
                            matrix(&format!("{a}.indexer.index_qk_proj"), (n + 1) * di, h),
                            always,
                        );
                        f.add(2 * di * bf16, always); // q_layernorm, k_layernorm
                                                      // The complete blocks' keys, f32 on the host.
                        f.kv_cache += 4 * di * ((context + 1) / qsa.compress_ratio);
                    }
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

impl DecodeFootprint {
    /// A PLE block (the `index`-th PLE layer, tensors under `p`): key and value projections,
    /// three grouped norms, the dilated conv and its window, the n-gram table with its hash
    /// buffers (one row per hashed head read per token).
    fn per_layer_embedding(
        &mut self,
        cfg: &Config,
        q: &Qwen4ExpConfig,
        ple: &PleConfig,
        index: usize,
        p: &str,
        matrix: &dyn Fn(&str, usize, usize) -> usize,
    ) {
        let (bf16, always) = (2, (1, 1));
        let streams = q.hc_count * cfg.hidden_size;
        let e = ple.embed_dim;
        self.add(matrix(&format!("{p}.key_proj"), streams, e), always);
        self.add(
            matrix(&format!("{p}.value_proj"), cfg.hidden_size, e),
            always,
        );
        self.add(3 * streams * bf16, always); // norm_key, norm_query, norm_conv
        self.add(streams * ple.conv_kernel * bf16, always); // conv1d
        let window = (ple.conv_kernel - 1) * ple.ngram_size * streams * 4;
        self.gdn_state += 2 * window;
        // mlx-vlm declares each shard's quantization; the shards share it.
        let table = format!("{p}.ple_embedding.ngram_embedding");
        let spec = cfg
            .quant_spec_for(&format!("{table}.shards.0"))
            .unwrap_or(cfg.quantization);
        let (heads, width) = (ple.heads(), ple.row_width());
        let rows = NgramHash::new(ple, index, cfg.vocab_size).rows as usize;
        // layer_multipliers, ngram_heads_vocab_sizes, ngram_heads_offsets (i64).
        let buffers = 8 * (ple.ngram_size + 2 * heads);
        self.ngram_tables += matrix_bytes(spec, rows, width) + buffers;
        self.active_weights += heads * matrix_bytes(spec, 1, width);
    }
}

/// A hyper-connection under `p`: its grouped norm, the low-rank down and up projections and,
/// in a layer, the injection weights.
fn hyper_connection(
    q: &Qwen4ExpConfig,
    h: usize,
    p: &str,
    inject: bool,
    matrix: &dyn Fn(&str, usize, usize) -> usize,
) -> usize {
    let (s, r) = (q.hc_count, q.hc_lowrank);
    let mut bytes = s * h * 2; // hc_norm
    bytes += matrix(&format!("{p}.input_mix_weight_down"), r, s * h);
    bytes += matrix(&format!("{p}.input_mix_weight_up"), s * h, r);
    if inject {
        bytes += matrix(&format!("{p}.block_inject_weight"), s, s * h);
    }
    bytes
}

/// One `[rows, cols]` matrix: packed words plus bf16 scales and biases, or bf16 values.
fn matrix_bytes(spec: Option<QuantSpec>, rows: usize, cols: usize) -> usize {
    match spec {
        Some(q) => rows * cols * q.bits / 8 + 2 * 2 * rows * (cols / q.group_size),
        None => 2 * rows * cols,
    }
}
