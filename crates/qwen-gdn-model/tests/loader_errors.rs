//! Broken checkpoints give one-line errors that name the file or tensor, never a panic.

mod common;
use candle_core::Device;
use common::*;
use qwen_gdn_model::Model;
use std::path::{Path, PathBuf};

/// A scratch copy of a fixture that a test may break.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    scratch_copy(&models_dir().join(name))
}

fn load_error(dir: &Path) -> String {
    match Model::load(dir, &Device::Cpu, &common::run_options()) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "error is not one line: {msg}");
            msg
        }
    }
}

/// [`load_error`], which must contain every one of `needles`.
fn assert_load_error(dir: &Path, needles: &[&str]) {
    let msg = load_error(dir);
    for needle in needles {
        assert!(msg.contains(needle), "`{needle}` missing: {msg}");
    }
}

#[test]
fn truncated_safetensors_names_the_file() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    assert_load_error(&dir, &["model.safetensors", "truncated"]);
}

#[test]
fn missing_shard_names_the_shard() {
    let (_tmp, dir) = scratch("qwen3.5-moe-tiny-4bit");
    assert!(
        dir.join("model.safetensors.index.json").exists(),
        "fixture should be sharded through an index"
    );
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert_load_error(&dir, &["missing shard model.safetensors"]);
}

#[test]
fn wrong_shape_names_tensor_and_file() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let key = "language_model.model.layers.0.linear_attn.norm.weight";
    reshape_in_header(&dir.join("model.safetensors"), key, &[2, 16]);
    assert_load_error(&dir, &[key, "model.safetensors", "expected [32]"]);
}

#[test]
fn wrong_quantized_shape_is_rejected() {
    let (_tmp, dir) = scratch("qwen3-next-tiny-4bit");
    let key = "model.layers.0.linear_attn.out_proj.weight";
    reshape_in_header(&dir.join("model.safetensors"), key, &[64, 32]);
    assert_load_error(&dir, &[key]);
}

#[test]
fn unknown_model_type_is_named() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .unwrap()
        .replacen("\"qwen3_5\"", "\"mamba9\"", 1);
    std::fs::write(&cfg_path, text).unwrap();
    assert_load_error(&dir, &["config.json", "unsupported model_type `mamba9`"]);
}

#[test]
fn missing_tensor_is_named() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let file = dir.join("model.safetensors");
    let key = "language_model.model.layers.1.linear_attn.A_log";
    let bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec())
        .unwrap()
        .replace(key, "renamed.A_log");
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&file, out).unwrap();
    assert_load_error(&dir, &["missing tensor `model.layers.1.linear_attn.A_log`"]);
}

#[test]
fn quantization_mismatch_with_config_is_named() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["quantization"]["group_size"] = 32.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    assert_load_error(&dir, &["config.json declares 4-bit group 32"]);
}

fn load(dir: &Path) -> Model {
    Model::load(dir, &Device::Cpu, &common::run_options()).unwrap()
}

/// Points every shard of the index at `name` instead.
fn list_shard_as(dir: &Path, name: &str) {
    let index = dir.join("model.safetensors.index.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    for v in json["weight_map"].as_object_mut().unwrap().values_mut() {
        *v = name.into();
    }
    std::fs::write(&index, json.to_string()).unwrap();
}

#[test]
fn shard_paths_stay_inside_the_folder() {
    let (tmp, dir) = scratch("qwen3.5-moe-tiny-4bit");
    // The same bytes next to the folder: reachable only by leaving it.
    std::fs::copy(
        dir.join("model.safetensors"),
        tmp.path().join("outside.safetensors"),
    )
    .unwrap();
    for name in [
        "../outside.safetensors".to_string(),
        tmp.path().join("outside.safetensors").display().to_string(),
        "sub/../../outside.safetensors".to_string(),
    ] {
        list_shard_as(&dir, &name);
        let msg = load_error(&dir);
        assert!(
            msg.contains("model.safetensors.index.json") && msg.contains("leaves the model folder"),
            "{name}: {msg}"
        );
    }
    // A symlink out of the folder is refused too.
    std::os::unix::fs::symlink(
        tmp.path().join("outside.safetensors"),
        dir.join("link.safetensors"),
    )
    .unwrap();
    list_shard_as(&dir, "link.safetensors");
    assert_load_error(&dir, &["outside the model folder"]);
}

#[test]
fn a_fifo_shard_is_refused_instead_of_blocking() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let shard = dir.join("model.safetensors");
    std::fs::remove_file(&shard).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&shard)
        .status()
        .unwrap();
    assert!(made.success());
    assert_load_error(&dir, &["model.safetensors", "not a regular file"]);
}

#[test]
fn hf_cache_snapshot_symlinks_into_blobs_load() {
    // models--org--name/snapshots/<commit>/<file> -> ../../blobs/<file>, as the Hub cache has.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models--org--tiny");
    let (blobs, snapshot) = (repo.join("blobs"), repo.join("snapshots/abc123"));
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    for entry in std::fs::read_dir(models_dir().join("qwen3.5-moe-tiny-4bit")).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap();
        std::fs::copy(&p, blobs.join(name)).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(name), snapshot.join(name))
            .unwrap();
    }
    load(&snapshot);
}

#[test]
fn fewer_layers_in_config_than_in_the_checkpoint() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    edit_config(&dir, |text| text["num_hidden_layers"] = 5.into());
    assert_load_error(
        &dir,
        &["config.json", "num_hidden_layers is 5", "model.layers.5"],
    );
}

/// Adds a shard holding one small tensor `key` to a sharded fixture.
fn add_tensor(dir: &Path, key: &str) {
    let data = vec![0u8; 8];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
    let index = dir.join("model.safetensors.index.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    let shard = format!(
        "extra-{}.safetensors",
        json["weight_map"].as_object().unwrap().len()
    );
    safetensors::serialize_to_file([(key, view)], None, &dir.join(&shard)).unwrap();
    json["weight_map"][key] = shard.into();
    std::fs::write(&index, json.to_string()).unwrap();
}

#[test]
fn unknown_tensors_are_listed_and_known_extras_warned_about() {
    let (_tmp, dir) = scratch("qwen3.5-moe-tiny-4bit");
    assert!(load(&dir).load_warnings().is_empty());
    add_tensor(&dir, "mtp.layers.0.fc.weight");
    add_tensor(
        &dir,
        "language_model.model.layers.3.self_attn.rotary_emb.inv_freq",
    );
    let model = load(&dir);
    let warnings = model.load_warnings();
    assert!(
        warnings.len() == 1
            && warnings[0].contains("1 multi-token")
            && warnings[0].contains("1 rotary_emb.inv_freq"),
        "{warnings:?}"
    );
    add_tensor(&dir, "language_model.model.layers.0.mlp.surprise.weight");
    assert_load_error(
        &dir,
        &[
            "`language_model.model.layers.0.mlp.surprise.weight`",
            "does not use",
        ],
    );
}

#[test]
fn vision_tower_tensors_of_a_raw_hf_checkpoint_are_skipped_with_a_warning() {
    let model = load(&models_dir().join("qwen3.5-moe-tiny-hf"));
    assert!(
        model
            .load_warnings()
            .iter()
            .any(|w| w.contains("vision tower")),
        "{:?}",
        model.load_warnings()
    );
}

/// Edits the text part of config.json (under `text_config` when there is one).
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    match cfg.get_mut("text_config") {
        Some(text) => edit(text),
        None => edit(&mut cfg),
    }
    std::fs::write(&path, cfg.to_string()).unwrap();
}

#[test]
fn huge_config_numbers_are_bounded_before_any_loop() {
    let (_tmp, dir) = scratch("qwen3-next-tiny-4bit");
    // Validation used to walk every one of 10^18 layers to look for an MoE one.
    edit_config(&dir, |c| {
        c["num_hidden_layers"] = 1_000_000_000_000_000_000u64.into();
        c["decoder_sparse_step"] = 1_000_000_000_000_000_000u64.into();
    });
    let started = std::time::Instant::now();
    let msg = load_error(&dir);
    assert!(started.elapsed().as_secs() < 10);
    assert!(
        msg.contains("config.json")
            && msg.contains("`num_hidden_layers`")
            && msg.contains("larger"),
        "{msg}"
    );
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    edit_config(&dir, |c| c["vocab_size"] = (1u64 << 40).into());
    assert!(load_error(&dir).contains("`vocab_size`"));
}

#[test]
fn numbers_that_must_be_positive() {
    for (key, value) in [
        ("rms_norm_eps", serde_json::json!(0.0)),
        ("rms_norm_eps", serde_json::json!(-1e-6)),
        ("rope_theta", serde_json::json!(-10000.0)),
        ("rope_theta", serde_json::json!(0)),
    ] {
        let (_tmp, dir) = scratch("qwen3-next-tiny-4bit");
        edit_config(&dir, |c| c[key] = value.clone());
        let msg = load_error(&dir);
        assert!(
            msg.contains("config.json")
                && msg.contains(&format!("`{key}` must be a positive number")),
            "{key} = {value}: {msg}"
        );
    }
}

#[test]
fn quantization_numbers_are_checked() {
    let set = |field: &str, value: serde_json::Value| {
        let (tmp, dir) = scratch("qwen3.5-tiny-4bit");
        let path = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["quantization"][field] = value;
        std::fs::write(&path, cfg.to_string()).unwrap();
        (tmp, dir)
    };
    // A string used to fall back to the default silently.
    let (_tmp, dir) = set("bits", "4".into());
    assert_load_error(&dir, &["`bits`", "positive integer"]);
    let (_tmp, dir) = set("bits", 0.into());
    assert!(load_error(&dir).contains("`bits`"));
    // 4-bit groups of 1-4 fill less than a word, which the kernels cannot walk.
    for group in [1, 4, 16] {
        let (_tmp, dir) = set("group_size", group.into());
        assert_load_error(&dir, &[&format!("group_size {group}"), "supported"]);
    }
}
