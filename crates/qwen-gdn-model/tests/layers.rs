//! Each layer type against mlx-lm's recorded activations, teacher-forced layer by layer: the
//! input of layer i is the reference residual stream, so an error cannot hide behind later
//! layers. Residual stream: h₋₁ = tf_embed, hᵢ = hᵢ₋₁ + tf_mixer.i + tf_mlp.i.

mod common;
use common::*;
use qwen_gdn_model::families::hybrid::{FeedForward, Mixer};

/// Per-layer outputs, relative to their largest magnitude.
const LAYER_GATE: f32 = 1e-4;

fn check_layers(name: &str) -> Vec<String> {
    let (model, r) = (load(name), Reference::load(name));
    let ids = r.ids("tf_ids");
    let embed = model.embed(&ids).unwrap();
    let d = rel_max_diff(&embed, &r.get("tf_embed").unsqueeze(0).unwrap());
    assert!(d <= 1e-6, "{name}: embedding differs by {d:e}");
    let mut cache = model.new_cache();
    let mut h = r.get("tf_embed").unsqueeze(0).unwrap();
    let mut seen = vec![];
    for (i, layer) in model.layers().iter().enumerate() {
        let mixer = layer.mixer_forward(&h, &mut cache.layers[i], 0).unwrap();
        let want_mixer = r.get(&format!("tf_mixer.{i}")).unsqueeze(0).unwrap();
        let d = rel_max_diff(&mixer, &want_mixer);
        assert!(
            d <= LAYER_GATE,
            "{name}: mixer of layer {i} differs by {d:e}"
        );
        let h_mid = (&h + &want_mixer).unwrap();
        let mlp = layer.feed_forward(&h_mid).unwrap();
        let want_mlp = r.get(&format!("tf_mlp.{i}")).unsqueeze(0).unwrap();
        let d = rel_max_diff(&mlp, &want_mlp);
        assert!(
            d <= LAYER_GATE,
            "{name}: feed-forward of layer {i} differs by {d:e}"
        );
        h = (h_mid + want_mlp).unwrap();
        seen.push(format!(
            "{}+{}",
            match layer.mixer {
                Mixer::Gdn(_) => "gdn",
                Mixer::Attention(_) => "attention",
            },
            match layer.feed_forward {
                FeedForward::Dense(_) => "mlp",
                FeedForward::Moe(_) => "moe",
            }
        ));
    }
    let d = rel_max_diff(
        &model.final_norm(&h).unwrap(),
        &r.get("tf_final_norm").unsqueeze(0).unwrap(),
    );
    assert!(d <= LAYER_GATE, "{name}: final norm differs by {d:e}");
    seen
}

/// [`check_layers`] on `name`, which must have layers of both `kinds` (mixer+feed-forward).
fn assert_checked_kinds(name: &str, kinds: [&str; 2]) {
    let seen = check_layers(name);
    assert!(
        kinds.iter().all(|k| seen.iter().any(|s| s == k)),
        "{name}: {seen:?}"
    );
}

#[test]
fn qwen3_next_gdn_attention_moe_layers() {
    assert_checked_kinds("qwen3-next-tiny-4bit", ["gdn+moe", "attention+moe"]);
}

#[test]
fn qwen35_dense_layers() {
    assert_checked_kinds("qwen3.5-tiny-4bit", ["gdn+mlp", "attention+mlp"]);
}

#[test]
fn qwen35_moe_layers() {
    assert_checked_kinds("qwen3.5-moe-tiny-4bit", ["gdn+moe", "attention+moe"]);
}

#[test]
fn layered_list_matches_references() {
    for name in LAYERED {
        assert!(
            Reference::load(name).0.contains_key("tf_mixer.0"),
            "{name} lacks per-layer activations"
        );
    }
}
