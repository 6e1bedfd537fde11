//! Every shipped config (models/*/config.json with its generation_config.json, and
//! tests/data/configs/*.json) parses to the values recorded in tests/data/config-snapshots/,
//! which were written by the hand-written reader this crate had before its serde structs.

mod common;

use common::models_dir;
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::Config;
use std::fmt::Write;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every public field and derived number of `cfg`, one per line, in a fixed order (the
/// quantization overrides sorted: their order follows serde_json's map, which the workspace's
/// features decide).
fn describe(cfg: &Config) -> String {
    let mut s = String::new();
    let mut line = |key: &str, value: String| writeln!(s, "{key} = {value}").unwrap();
    line("model_type", cfg.model_type.clone());
    line("family", format!("{:?}", cfg.family));
    for (key, v) in [
        ("hidden_size", cfg.hidden_size),
        ("num_hidden_layers", cfg.num_hidden_layers),
        ("intermediate_size", cfg.intermediate_size),
        ("vocab_size", cfg.vocab_size),
        ("max_position_embeddings", cfg.max_position_embeddings),
        ("num_attention_heads", cfg.num_attention_heads),
        ("num_key_value_heads", cfg.num_key_value_heads),
        ("head_dim", cfg.head_dim),
        ("full_attention_interval", cfg.full_attention_interval),
        ("linear_num_key_heads", cfg.linear_num_key_heads),
        ("linear_num_value_heads", cfg.linear_num_value_heads),
        ("linear_key_head_dim", cfg.linear_key_head_dim),
        ("linear_value_head_dim", cfg.linear_value_head_dim),
        ("linear_conv_kernel_dim", cfg.linear_conv_kernel_dim),
        ("num_experts", cfg.num_experts),
        ("num_experts_per_tok", cfg.num_experts_per_tok),
        ("moe_intermediate_size", cfg.moe_intermediate_size),
        (
            "shared_expert_intermediate_size",
            cfg.shared_expert_intermediate_size,
        ),
        ("decoder_sparse_step", cfg.decoder_sparse_step),
        ("rope_dims()", cfg.rope_dims()),
        ("key_dim()", cfg.key_dim()),
        ("value_dim()", cfg.value_dim()),
        ("conv_dim()", cfg.conv_dim()),
    ] {
        line(key, v.to_string());
    }
    for (key, v) in [
        ("rms_norm_eps", cfg.rms_norm_eps),
        ("rope_theta", cfg.rope_theta),
        ("partial_rotary_factor", cfg.partial_rotary_factor),
    ] {
        line(key, format!("{v:?}"));
    }
    for (key, v) in [
        ("tie_word_embeddings", cfg.tie_word_embeddings),
        ("attention_bias", cfg.attention_bias),
        ("norm_topk_prob", cfg.norm_topk_prob),
    ] {
        line(key, v.to_string());
    }
    line("mlp_only_layers", format!("{:?}", cfg.mlp_only_layers));
    line("eos_token_id", format!("{:?}", cfg.eos_token_id));
    line("quantization", format!("{:?}", cfg.quantization));
    let mut overrides = cfg.quantization_overrides.clone();
    overrides.sort_by(|a, b| a.0.cmp(&b.0));
    for (module, spec) in &overrides {
        line(&format!("quantization[{module}]"), format!("{spec:?}"));
        assert_eq!(cfg.quant_spec_for(module), Some(*spec));
    }
    let kinds: String = (0..cfg.num_hidden_layers)
        .map(|i| match cfg.layer_kind(i) {
            LayerKind::LinearAttention => 'L',
            LayerKind::FullAttention => 'A',
        })
        .collect();
    line("layer_kind(i)", kinds);
    let moe: String = (0..cfg.num_hidden_layers)
        .map(|i| if cfg.is_moe_layer(i) { 'M' } else { '-' })
        .collect();
    line("is_moe_layer(i)", moe);
    line("qwen4_exp", format!("{:?}", cfg.qwen4_exp));
    s
}

fn check(name: &str, cfg: &Config) {
    assert!(
        cfg.unknown_fields.is_empty(),
        "{name}: a shipped config gets no notice: {:?}",
        cfg.unknown_fields
    );
    let path = repo().join(format!("tests/data/config-snapshots/{name}.txt"));
    let got = describe(cfg);
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; this config gives:\n{got}", path.display()));
    assert_eq!(
        got,
        want,
        "{name}: parsed config differs from {}",
        path.display()
    );
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_model_config_parses_to_its_snapshot() {
    let mut seen = 0;
    for entry in std::fs::read_dir(models_dir()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("config.json").exists() {
            continue;
        }
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        check(&name, &Config::from_dir(&dir).unwrap());
        seen += 1;
    }
    assert_eq!(seen, 7, "models/ holds seven checkpoints");
}

#[test]
fn every_test_data_config_parses_to_its_snapshot() {
    let files = json_files(&repo().join("tests/data/configs"));
    assert_eq!(files.len(), 2);
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_stem().unwrap().to_str().unwrap();
        check(name, &Config::from_json_str(&text, name).unwrap());
    }
}
