//! NaN or Inf in the model: found and traced to the first part that produced it.

mod common;
use candle_core::Device;
use common::*;
use qwen_gdn_model::diagnose::{all_finite, first_non_finite, Origin};
use qwen_gdn_model::Model;
use std::path::Path;

/// Overwrites every element of a bf16 tensor in a safetensors file with NaN.
fn poison_bf16(file: &Path, key: &str) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[key]["dtype"], "BF16", "{key}");
    let offsets = &header[key]["data_offsets"];
    let (a, b) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    for x in bytes[8 + n + a..8 + n + b].chunks_exact_mut(2) {
        x.copy_from_slice(&half::bf16::NAN.to_le_bytes());
    }
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn finite_check() {
    let t = |v: &[f32]| candle_core::Tensor::new(v, &Device::Cpu).unwrap();
    assert!(all_finite(&t(&[1.0, -3e38, 0.0])).unwrap());
    assert!(!all_finite(&t(&[1.0, f32::NAN])).unwrap());
    assert!(!all_finite(&t(&[f32::INFINITY, 1.0])).unwrap());
    assert!(!all_finite(&t(&[f32::NEG_INFINITY])).unwrap());
}

#[test]
fn the_first_broken_layer_is_named() {
    let (_tmp, dir) = scratch_copy(&models_dir().join("qwen3.5-tiny-4bit"));
    let tokens = [1u32, 2, 3, 4, 5];
    let model = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
    let mut cache = model.new_cache();
    assert!(all_finite(&model.forward(&tokens, &mut cache).unwrap()).unwrap());

    poison_bf16(
        &dir.join("model.safetensors"),
        "language_model.model.layers.2.post_attention_layernorm.weight",
    );
    let model = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
    let mut cache = model.new_cache();
    assert!(!all_finite(&model.forward(&tokens, &mut cache).unwrap()).unwrap());
    // Chunks of 2: the walk carries the cache from chunk to chunk as the model does.
    let origin = first_non_finite(&model, &tokens, 2).unwrap();
    assert_eq!(origin, Origin::FeedForward { layer: 2 });
    assert_eq!(
        origin.to_string(),
        "layer 2's feed-forward (model.layers.2.mlp)"
    );

    poison_bf16(
        &dir.join("model.safetensors"),
        "language_model.model.layers.1.input_layernorm.weight",
    );
    let model = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
    let origin = first_non_finite(&model, &tokens, 16).unwrap();
    assert_eq!(
        origin,
        Origin::Mixer {
            layer: 1,
            attention: false
        }
    );
}

/// qwen4_exp: the walk goes through its own parts (per-layer embedding, mixer and MoE with
/// their hyper-connections, the final stream mixer), each poisoned in turn, later parts first.
#[test]
fn the_first_broken_qwen4_exp_part_is_named() {
    let (_tmp, dir) = scratch_copy(&models_dir().join("qwen4-exp-tiny-hf"));
    let tokens = [1u32, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13];
    let model = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
    assert_eq!(
        first_non_finite(&model, &tokens, 5).unwrap(),
        Origin::Head,
        "the fixture is finite"
    );
    for (tensor, want, shown) in [
        (
            "hyper_connection_mixer.hc_norm",
            Origin::FinalMixer,
            "the final stream mixer (model.hyper_connection_mixer)",
        ),
        (
            "layers.3.ple.norm_key",
            Origin::PerLayerEmbedding { layer: 3 },
            "layer 3's per-layer n-gram embedding (model.layers.3.ple)",
        ),
        (
            "layers.2.mlp_hyper_connection.hc_norm",
            Origin::FeedForward { layer: 2 },
            "layer 2's feed-forward (model.layers.2.mlp)",
        ),
        (
            "layers.2.self_attn.q_norm",
            Origin::Mixer {
                layer: 2,
                attention: true,
            },
            "layer 2's attention (model.layers.2.self_attn)",
        ),
    ] {
        poison_bf16(
            &dir.join("model.safetensors"),
            &format!("model.language_model.{tensor}.weight"),
        );
        let model = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
        let logits = model.forward(&tokens, &mut model.new_cache()).unwrap();
        assert!(!all_finite(&logits).unwrap(), "{tensor}");
        // Chunks of 5: the walk carries the n-gram context, PLE window and QSA keys.
        let origin = first_non_finite(&model, &tokens, 5).unwrap();
        assert_eq!(origin, want, "{tensor}");
        assert_eq!(origin.to_string(), shown);
    }
}
