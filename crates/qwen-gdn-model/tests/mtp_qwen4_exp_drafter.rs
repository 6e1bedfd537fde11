//! Qwen3.8-Flash-Next's MTP head from mlx-vlm's separate drafter checkpoint (docs/mtp.md §8):
//! the tiny fixture's head split by mlx-vlm 0.7.10's own `split_qwen4_exp_mtp`
//! (scripts/gen_fixture_qwen4_exp_drafter.py) into models/mtp/qwen4-exp-mtp-tiny-drafter-bf16
//! and -4bit, lent to the main model models/qwen4-exp-tiny-hf. Its logits and chained drafts
//! against mlx-vlm's `load_drafter` of the same folders, the bf16 drafter against the HF-layout
//! head it was split from, and a drafter that does not fit refused in one line.

mod common;
use candle_core::{DType, Device, Tensor};
use common::qwen4_exp_head::{
    chained_drafts, head_logits_on, mtp_reference as reference, rows_with_a_margin, select,
};
use common::*;
use qwen_gdn_model::Model;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const BF16: &str = "qwen4-exp-mtp-tiny-drafter-bf16";
const FOUR_BIT: &str = "qwen4-exp-mtp-tiny-drafter-4bit";

fn mtp_dir(name: &str) -> PathBuf {
    models_dir().join("mtp").join(name)
}

/// The main model without a head of its own (its checkpoint's `mtp.fc` placeholder is not a
/// head), the same main weights the drafter's head was trained on.
fn main_model() -> Model {
    let dir = models_dir().join("qwen4-exp-tiny-hf");
    Model::load(&dir, &Device::Cpu, &run_options())
        .unwrap_or_else(|e| panic!("loading {}: {e:#}", dir.display()))
}

/// The main model with the head of the folder `head` (a drafter, or an HF checkpoint).
fn with_head(head: &Path) -> Model {
    let mut model = main_model();
    let loaded = model
        .load_mtp(head)
        .unwrap_or_else(|e| panic!("{}: {e:#}", head.display()));
    assert!(loaded, "{}: no MTP head", head.display());
    model
}

/// The drafter's head logits against mlx-vlm's on the rows with a margin: the error relative
/// to max|logit|.
fn logits_error(name: &str) -> f32 {
    let model = with_head(&mtp_dir(name));
    let reference = reference(name);
    let ids = reference.ids("ids");
    let got = head_logits_on(&model, reference.get("streams"), &ids);
    let (rows, tied) = rows_with_a_margin(&reference);
    assert!(tied.len() <= 2, "{name}: tied rows {tied:?}");
    let want = reference.get("head_logits");
    let err = rel_max_diff(&select(&got, &rows), &select(want, &rows));
    eprintln!(
        "{name}: head logits {err:.2e} of max|logit| on {} rows (tied {tied:?})",
        rows.len()
    );
    err
}

/// mlx-vlm's `draft_block` after its prefill over the pairs up to `chain_at`, replayed: our
/// tokens, mlx-vlm's and the logits' error relative to max|logit|.
fn chained(name: &str) -> (Vec<u32>, Vec<u32>, f32) {
    let reference = reference(name);
    let (tokens, err) = chained_drafts(&with_head(&mtp_dir(name)), &reference);
    eprintln!("{name}: chain {tokens:?}, logits {err:.2e}");
    (tokens, reference.ids("chain_tokens"), err)
}

#[test]
fn the_bf16_drafter_is_the_hf_head_it_was_split_from() {
    // The same bf16 numbers under mlx-vlm's names and stacking: the same logits.
    let reference = reference(BF16);
    let ids = reference.ids("ids");
    let streams = reference.get("streams");
    let drafter = head_logits_on(&with_head(&mtp_dir(BF16)), streams, &ids);
    let hf = head_logits_on(&with_head(&mtp_dir("qwen4-exp-mtp-tiny-hf")), streams, &ids);
    let err = rel_max_diff(&drafter, &hf);
    eprintln!("bf16 drafter vs HF-layout head: {err:.2e} of max|logit|");
    assert!(err <= 1e-6, "bf16 drafter vs HF head: {err:.2e}");
}

#[test]
fn bf16_drafter_logits_match_mlx_vlms() {
    let err = logits_error(BF16);
    assert!(err < 1e-4, "head logits off by {err:.2e}");
}

#[test]
fn four_bit_drafter_logits_match_mlx_vlms() {
    let err = logits_error(FOUR_BIT);
    assert!(err < 1e-4, "head logits off by {err:.2e}");
}

#[test]
fn bf16_drafter_chains_mlx_vlms_drafts() {
    let (got, want, err) = chained(BF16);
    assert_eq!(got, want);
    assert!(err < 1e-4, "chained logits off by {err:.2e}");
}

#[test]
fn four_bit_drafter_chains_mlx_vlms_drafts() {
    let (got, want, err) = chained(FOUR_BIT);
    assert_eq!(got, want);
    assert!(err < 1e-4, "chained logits off by {err:.2e}");
}

/// A copy of the drafter `name` with its tensors and its config.json rewritten.
fn edited_drafter(
    name: &str,
    tensors: impl Fn(&mut HashMap<String, Tensor>),
    config: impl Fn(&mut serde_json::Value),
) -> (tempfile::TempDir, PathBuf) {
    let (tmp, dir) = scratch_copy(&mtp_dir(name));
    let file = dir.join("model.safetensors");
    let mut t = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    tensors(&mut t);
    candle_core::safetensors::save(&t, &file).unwrap();
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config(&mut json);
    std::fs::write(&path, json.to_string()).unwrap();
    (tmp, dir)
}

type TensorEdit = Box<dyn Fn(&mut HashMap<String, Tensor>)>;
type ConfigEdit = Box<dyn Fn(&mut serde_json::Value)>;

#[test]
fn a_drafter_that_does_not_fit_is_a_one_line_error() {
    let keep: fn(&mut HashMap<String, Tensor>) = |_| {};
    let same: fn(&mut serde_json::Value) = |_| {};
    let cases: Vec<(&str, TensorEdit, ConfigEdit, [&str; 2])> = vec![
        // A drafter of another model: its config says so before a tensor is read.
        (
            BF16,
            Box::new(keep),
            Box::new(|j| j["text_config"]["hidden_size"] = 128.into()),
            [
                "config.json: text_config.hidden_size is 128",
                "main model's is 64",
            ],
        ),
        // Its tensors of another width, the config left right.
        (
            BF16,
            Box::new(|t| {
                let wide = Tensor::zeros((64, 128), DType::BF16, &Device::Cpu).unwrap();
                t.insert("fc_hidden.weight".into(), wide);
            }),
            Box::new(same),
            ["fc_hidden.weight", "expected [64, 64]"],
        ),
        (
            BF16,
            Box::new(|t| {
                t.remove("layers.0.mlp.switch_mlp.up_proj.weight");
            }),
            Box::new(same),
            [
                "missing tensor `layers.0.mlp.switch_mlp.up_proj.weight`",
                "model.safetensors",
            ],
        ),
        // Quantized otherwise than its own config declares, globally or per tensor.
        (
            FOUR_BIT,
            Box::new(keep),
            Box::new(|j| j["quantization"]["bits"] = 8.into()),
            [
                "stored as 4-bit group 64",
                "config.json declares 8-bit group 64",
            ],
        ),
        (
            FOUR_BIT,
            Box::new(keep),
            Box::new(|j| {
                j["quantization"]["layers.0.self_attn.q_proj"] =
                    serde_json::json!({"bits": 8, "group_size": 64})
            }),
            [
                "layers.0.self_attn.q_proj.weight",
                "declares 8-bit group 64",
            ],
        ),
    ];
    for (name, tensors, config, expected) in cases {
        let (_tmp, dir) = edited_drafter(name, tensors, config);
        let mut model = main_model();
        let msg = format!("{:#}", model.load_mtp(&dir).unwrap_err());
        eprintln!("{msg}");
        assert!(!msg.contains('\n'), "not one line: {msg}");
        for want in expected {
            assert!(msg.contains(want), "{want:?} not in: {msg}");
        }
    }
}

#[test]
fn a_qwen4_exp_drafter_is_refused_for_another_family() {
    let dir = models_dir().join("qwen3.5-moe-tiny-hf");
    let mut model = Model::load(&dir, &Device::Cpu, &run_options()).unwrap();
    let msg = format!("{:#}", model.load_mtp(&mtp_dir(BF16)).unwrap_err());
    assert!(!msg.contains('\n'), "not one line: {msg}");
    assert!(
        msg.contains("`qwen4_exp_mtp` drafter drafts for qwen4_exp") && msg.contains("qwen3_5_moe"),
        "{msg}"
    );
}

#[test]
fn greedy_output_with_either_drafter_equals_greedy_output_without() {
    use qwen_gdn_model::speculative::DraftLength;
    // From a prompt the head was trained on (it memorised its continuation: drafts are
    // accepted; docs/mtp.md §8) and the held-out reference prompt.
    let hf = reference("qwen4-exp-mtp-tiny-hf");
    let (trained, held) = (hf.ids("train_prompt_ids"), hf.ids("ids")[..12].to_vec());
    for name in [BF16, FOUR_BIT] {
        let model = with_head(&mtp_dir(name));
        for prompt in [&trained[..], &held[..]] {
            let want = greedy(&model, prompt, 48);
            for k in 1..=3 {
                let (got, spec) = speculative_greedy(&model, prompt, 48, DraftLength::Fixed(k));
                assert_eq!(got, want, "{name}: prompt of {}, k = {k}", prompt.len());
                let s = &spec.stats;
                eprintln!(
                    "{name} prompt {} k = {k}: acceptance {:.3} ({}/{})",
                    if prompt == &trained[..] {
                        "trained"
                    } else {
                        "held out"
                    },
                    s.acceptance(),
                    s.accepted,
                    s.drafted
                );
                if prompt == &trained[..] {
                    assert!(s.accepted > 0, "{name} k = {k}: nothing accepted: {s:?}");
                }
            }
        }
    }
}

#[test]
fn only_a_drafter_quantized_by_its_maker_keeps_its_float_matrices() {
    // `--mtp-from` quantizes a head's float matrices to a quantized main model's bits, but
    // not a drafter that mlx-vlm quantized: its float ones (the router gate, the matrices
    // whose width does not split into groups) were kept float on purpose.
    use qwen_gdn_model::weights::Checkpoint;
    let config = main_model().config().clone();
    let declares = |name: &str| {
        let ckpt = Checkpoint::open_mtp(&mtp_dir(name), &config)
            .unwrap()
            .unwrap();
        ckpt.declares_its_own_quantization()
    };
    assert!(declares(FOUR_BIT));
    assert!(!declares(BF16));
    assert!(!declares("qwen4-exp-mtp-tiny-hf"));
}
