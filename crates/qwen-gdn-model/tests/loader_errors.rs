//! Broken checkpoints give one-line errors that name the file or tensor, never a panic.

mod common;
use candle_core::Device;
use common::*;
use qwen_gdn_model::{LoadOptions, Model};
use std::path::{Path, PathBuf};

/// A scratch copy of a fixture that a test may break.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(models_dir().join(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    (tmp, dir)
}

fn load_error(dir: &Path) -> String {
    match Model::load(dir, &Device::Cpu, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "error is not one line: {msg}");
            msg
        }
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
    let msg = load_error(&dir);
    assert!(
        msg.contains("model.safetensors") && msg.contains("truncated"),
        "{msg}"
    );
}

#[test]
fn missing_shard_names_the_shard() {
    let (_tmp, dir) = scratch("qwen3.5-moe-tiny-4bit");
    assert!(
        dir.join("model.safetensors.index.json").exists(),
        "fixture should be sharded through an index"
    );
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let msg = load_error(&dir);
    assert!(msg.contains("missing shard model.safetensors"), "{msg}");
}

/// Rewrites a tensor's declared shape in the safetensors header, keeping its bytes.
fn reshape_in_header(file: &Path, tensor: &str, shape: &[usize]) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header[tensor]["shape"] = serde_json::json!(shape);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

#[test]
fn wrong_shape_names_tensor_and_file() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let key = "language_model.model.layers.0.linear_attn.norm.weight";
    reshape_in_header(&dir.join("model.safetensors"), key, &[2, 16]);
    let msg = load_error(&dir);
    assert!(
        msg.contains(key) && msg.contains("model.safetensors") && msg.contains("expected [32]"),
        "{msg}"
    );
}

#[test]
fn wrong_quantized_shape_is_rejected() {
    let (_tmp, dir) = scratch("qwen3-next-tiny-4bit");
    let key = "model.layers.0.linear_attn.out_proj.weight";
    reshape_in_header(&dir.join("model.safetensors"), key, &[64, 32]);
    let msg = load_error(&dir);
    assert!(msg.contains(key), "{msg}");
}

#[test]
fn unknown_model_type_is_named() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .unwrap()
        .replacen("\"qwen3_5\"", "\"mamba9\"", 1);
    std::fs::write(&cfg_path, text).unwrap();
    let msg = load_error(&dir);
    assert!(
        msg.contains("config.json") && msg.contains("unsupported model_type `mamba9`"),
        "{msg}"
    );
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
    let msg = load_error(&dir);
    assert!(
        msg.contains("missing tensor `model.layers.1.linear_attn.A_log`"),
        "{msg}"
    );
}

#[test]
fn quantization_mismatch_with_config_is_named() {
    let (_tmp, dir) = scratch("qwen3.5-tiny-4bit");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["quantization"]["group_size"] = 32.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let msg = load_error(&dir);
    assert!(msg.contains("config.json declares 4-bit group 32"), "{msg}");
}
