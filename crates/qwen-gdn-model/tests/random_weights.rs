//! `Model::random` (bench --random-weights) against the written checkpoints: on every mlx
//! fixture, the model of random weights reads exactly the tensors the checkpoint's model
//! reads, with the same dtypes and shapes (so the same bits and group sizes), and a config
//! that declares another layout (the router at 4 bits instead of 8) is told apart. The raw-HF
//! fixtures are not compared: random weights take the mlx layout, as bench's configs do.

mod common;

use candle_core::Device;
use qwen_gdn_model::{Config, Model, RandomWeights};
use std::path::PathBuf;

const MLX_FIXTURES: [&str; 5] = [
    "qwen3-next-tiny-4bit",
    "qwen3-next-tiny-bf16",
    "qwen3.5-tiny-4bit",
    "qwen3.5-moe-tiny-4bit",
    "qwen4-exp-tiny-4bit",
];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

fn random(cfg: Config) -> Model {
    let weights = RandomWeights {
        seed: 3,
        ngram_rows: u64::MAX,
    };
    let (cfg, note) = weights.shape_config(cfg);
    assert!(note.is_none(), "the fixtures' tables are small: {note:?}");
    Model::random(cfg, weights, &Device::Cpu, &common::run_options()).unwrap()
}

#[test]
fn random_model_reads_the_checkpoints_tensors_in_their_layouts() {
    for name in MLX_FIXTURES {
        let dir = fixture(name);
        let written = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
        let made = random(Config::from_dir(&dir).unwrap());
        let (w, m) = (
            split_ngram(written.weight_layout()),
            split_ngram(made.weight_layout()),
        );
        // The n-gram tables: mlx-vlm writes shards of its own sizes and the hash constants;
        // random weights make one shard per table. The rows and their layout must agree.
        assert_eq!(w.1, m.1, "{name}: n-gram tables (rows, dtype, row shape)");
        let (w, m) = (w.0, m.0);
        assert!(!w.is_empty(), "{name}: no tensors read");
        for (a, b) in w.iter().zip(&m) {
            assert_eq!(a, b, "{name}: checkpoint vs random weights");
        }
        assert_eq!(w.len(), m.len(), "{name}: tensor count");
    }
}

type Layout = Vec<(String, String, Vec<usize>)>;

/// The layout without the n-gram tables, and each table's (part, total rows, dtype, row
/// shape), the shards summed.
fn split_ngram(layout: &[(String, String, Vec<usize>)]) -> (Layout, Layout) {
    let mut rest = vec![];
    let mut tables: Layout = vec![];
    for (name, dtype, shape) in layout {
        let Some(at) = name.find(".ngram_embedding.") else {
            if !name.contains(".ple_embedding.") {
                rest.push((name.clone(), dtype.clone(), shape.clone()));
            }
            continue;
        };
        let part = name.rsplit('.').next().unwrap_or_default();
        let key = format!("{}.{part}", &name[..at]);
        let row: Vec<usize> = shape[1..].to_vec();
        match tables.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, d, s)) => {
                assert_eq!((&*d, &s[1..]), (dtype, &row[..]), "{name}: shards differ");
                s[0] += shape[0];
            }
            None => tables.push((key, dtype.clone(), shape.clone())),
        }
    }
    tables.sort();
    (rest, tables)
}

#[test]
fn a_router_declared_at_4_bits_changes_the_layout() {
    let dir = fixture("qwen3.5-moe-tiny-4bit");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let eight = Config::from_dir(&dir).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let quant = json["quantization"].as_object_mut().unwrap();
    let mut changed = 0;
    for (key, entry) in quant.iter_mut() {
        if key.ends_with("mlp.gate") {
            entry["bits"] = 4.into();
            changed += 1;
        }
    }
    assert!(changed > 0, "the fixture declares its routers");
    let four = Config::from_json_str(&json.to_string(), "edited").unwrap();
    let (a, b) = (random(eight), random(four));
    let router = |m: &Model| {
        m.weight_layout()
            .iter()
            .find(|(n, _, _)| n == "model.layers.0.mlp.gate.weight")
            .cloned()
            .unwrap()
    };
    let (r8, r4) = (router(&a), router(&b));
    assert_eq!(
        r8.2[1] * 2,
        r4.2[1] * 4,
        "8-bit words hold 4 values, 4-bit 8"
    );
    assert_ne!(r8, r4);
}

#[test]
fn random_logits_are_finite_and_seeded() {
    let dir = fixture("qwen4-exp-tiny-4bit");
    let a = random(Config::from_dir(&dir).unwrap());
    let b = random(Config::from_dir(&dir).unwrap());
    let logits = |m: &Model| {
        let mut cache = m.new_cache();
        m.forward_last(&[1, 2, 3, 4], &mut cache)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let (la, lb) = (logits(&a), logits(&b));
    assert!(la.iter().all(|v| v.is_finite()));
    assert!(la.iter().any(|v| *v != 0.0));
    assert_eq!(la, lb, "same seed, same logits");
}
