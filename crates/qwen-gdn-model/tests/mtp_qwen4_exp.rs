//! Qwen3.8-Flash-Next's (`qwen4_exp`) own MTP head (docs/mtp.md §8) on its fixture
//! (scripts/gen_fixture_qwen4_exp_mtp.py, models/mtp/qwen4-exp-mtp-tiny-hf): the head's logits
//! and its chained drafts against mlx-vlm 0.7.10's drafter, both norm conventions, a mis-shaped
//! or missing tensor refused in one line, and greedy output with speculation equal to without
//! (the verify pass and the replay rollback of `qwen4_exp`'s cache).

mod common;
use candle_core::{DType, Device, Tensor};
use common::qwen4_exp_head::*;
use common::*;
use qwen_gdn_model::speculative::{DraftLength, Speculation, ADAPTIVE_MAX};
use qwen_gdn_model::Model;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const NAME: &str = "qwen4-exp-mtp-tiny-hf";

fn fixture() -> PathBuf {
    models_dir().join("mtp").join(NAME)
}

fn load_mtp(dir: &Path) -> Model {
    let mut model = Model::load(dir, &Device::Cpu, &run_options())
        .unwrap_or_else(|e| panic!("loading {}: {e:#}", dir.display()));
    assert!(
        model.load_mtp(dir).unwrap(),
        "{}: no MTP head",
        dir.display()
    );
    model
}

fn reference() -> Reference {
    mtp_reference(NAME)
}

#[test]
fn head_logits_match_mlx_vlms_drafter() {
    let model = load_mtp(&fixture());
    let reference = reference();
    let ids = reference.ids("ids");
    let want = reference.get("head_logits");
    // The head alone, on mlx-vlm's streams.
    let got = head_logits_on(&model, reference.get("streams"), &ids);
    let (rows, tied) = rows_with_a_margin(&reference);
    let head_err = rel_max_diff(&select(&got, &rows), &select(want, &rows));
    // End to end: our main model's streams (before its final mixer) into our head.
    let streams = model.forward_normed(&ids, &mut model.new_cache()).unwrap();
    let streams_err = rel_max_diff(&streams.squeeze(0).unwrap(), reference.get("streams"));
    let main_err = rel_max_diff(
        &model.head_logits(&streams).unwrap(),
        reference.get("main_logits"),
    );
    let e2e = head_logits_on(&model, &streams.squeeze(0).unwrap(), &ids);
    let e2e_err = rel_max_diff(&select(&e2e, &rows), &select(want, &rows));
    eprintln!(
        "{NAME}: head {head_err:.2e}, streams {streams_err:.2e}, main logits {main_err:.2e}, end to end {e2e_err:.2e} (of max|logit|) on {} rows; tied rows {tied:?}",
        rows.len()
    );
    // Ties at the indexer's cut-off are rare (one row of 63 in the fixture).
    assert!(tied.len() <= 2, "tied rows {tied:?}");
    assert!(head_err < 1e-4, "head logits off by {head_err:.2e}");
    assert!(streams_err < 1e-4, "streams off by {streams_err:.2e}");
    assert!(main_err < 1e-4, "main logits off by {main_err:.2e}");
    assert!(
        e2e_err < 1e-4,
        "end-to-end head logits off by {e2e_err:.2e}"
    );
}

#[test]
fn chained_drafts_are_mlx_vlms() {
    // mlx-vlm's draft_block after its prefill over the pairs up to `at`.
    let reference = reference();
    let (tokens, err) = chained_drafts(&load_mtp(&fixture()), &reference);
    assert_eq!(tokens, reference.ids("chain_tokens"));
    assert!(err < 1e-4, "chained logits off by {err:.2e}");
}

/// A change to a checkpoint's tensors.
type Edit = dyn Fn(&mut HashMap<String, Tensor>);

/// A copy of the fixture whose `mtp.*` tensors are rewritten by `edit` (f32 where changed).
fn edited_copy(edit: impl Fn(&mut HashMap<String, Tensor>)) -> (tempfile::TempDir, PathBuf) {
    let (tmp, dir) = scratch_copy(&fixture());
    let file = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, &file).unwrap();
    (tmp, dir)
}

/// `mtp.*.<…norm…>.weight`: the head's nine norms (pre-fc ×2, q/k, the indexer's q/k, three
/// hyper-connections').
fn is_head_norm(name: &str) -> bool {
    let module = name.rsplit('.').nth(1).unwrap_or("");
    name.starts_with("mtp.") && name.ends_with(".weight") && module.contains("norm")
}

#[test]
fn shifted_and_zero_centred_head_norms_are_both_read_right() {
    // The fixture stores every head norm zero-centred, as the HF layout and mlx-vlm do; a
    // conversion that shifted them (1 + w, in f32 here so that nothing rounds) must give the
    // same drafts. Read in the wrong convention, a norm scales its output by about 1 ± w
    // (the break in the report).
    let (_tmp, shifted) = edited_copy(|t| {
        let names: Vec<String> = t.keys().filter(|k| is_head_norm(k)).cloned().collect();
        assert_eq!(names.len(), 9, "{names:?}");
        for k in names {
            let w = t[&k].to_dtype(DType::F32).unwrap();
            t.insert(k, (w + 1.0).unwrap());
        }
    });
    let reference = reference();
    let ids = reference.ids("ids");
    let want = head_logits_on(&load_mtp(&fixture()), reference.get("streams"), &ids);
    let got = head_logits_on(&load_mtp(&shifted), reference.get("streams"), &ids);
    let err = rel_max_diff(&got, &want);
    eprintln!("shifted head norms vs zero-centred: {err:.2e} of max|logit|");
    assert!(err < 1e-6, "shifted norms read differently: {err:.2e}");
}

#[test]
fn a_missing_or_mis_shaped_head_tensor_is_a_one_line_error() {
    const H: usize = 64;
    let cases: [(&str, Box<Edit>, &str); 2] = [
        (
            "mtp.fc_hidden.weight",
            Box::new(|t| {
                t.insert(
                    "mtp.fc_hidden.weight".into(),
                    Tensor::zeros((H, 2 * H), DType::F32, &Device::Cpu).unwrap(),
                );
            }),
            "expected [64, 64]",
        ),
        (
            "mtp.hyper_connection_mixer.input_mix_weight_up.weight",
            Box::new(|t| {
                t.remove("mtp.hyper_connection_mixer.input_mix_weight_up.weight");
            }),
            "",
        ),
    ];
    for (tensor, edit, expected) in cases {
        let (_tmp, dir) = edited_copy(edit);
        let mut model = Model::load(&dir, &Device::Cpu, &run_options()).unwrap();
        let msg = format!("{:#}", model.load_mtp(&dir).unwrap_err());
        assert!(!msg.contains('\n'), "not one line: {msg}");
        assert!(msg.contains(tensor) && msg.contains(expected), "{msg}");
    }
}

#[test]
fn greedy_output_with_speculation_equals_greedy_output_without() {
    let model = load_mtp(&fixture());
    let reference = reference();
    let ids = reference.ids("ids");
    let trained = reference.ids("train_prompt_ids");
    // A training prompt (the head memorised its continuation: drafts are accepted), the
    // held-out reference prompt (few are), and a longer one whose head history starts after
    // a prefilled part.
    for prompt in [&trained[..], &ids[..12], &ids[..40]] {
        let want = greedy(&model, prompt, 64);
        let lengths = (1..=4)
            .map(DraftLength::Fixed)
            .chain([DraftLength::adaptive(ADAPTIVE_MAX)]);
        for length in lengths {
            let (got, spec) = speculative_greedy(&model, prompt, 64, length.clone());
            assert_eq!(got, want, "prompt of {}: {length}", prompt.len());
            let s = &spec.stats;
            eprintln!(
                "prompt {} {length}: acceptance {:.3}, {:.2} tokens per verify step ({} steps)",
                prompt.len(),
                s.acceptance(),
                s.tokens_per_step(),
                s.steps
            );
            if prompt == &trained[..] {
                assert!(s.accepted > 0, "{length}: nothing accepted: {s:?}");
            }
        }
    }
}

/// On a prompt it was trained on (its held-out top-1 is low: the tiny random model's
/// continuations are memorised, not learnt; the .json has the record).
#[test]
fn the_trained_head_is_accepted_often() {
    let model = load_mtp(&fixture());
    let prompt = reference().ids("train_prompt_ids");
    let (_, spec) = speculative_greedy(&model, &prompt, 64, DraftLength::Fixed(1));
    eprintln!("k = 1: {:?}", spec.stats);
    assert!(spec.stats.acceptance() > 0.3, "{:?}", spec.stats);
}

#[test]
fn after_rejected_drafts_the_head_is_as_if_it_saw_only_the_kept_pairs() {
    // Each step drafts k = 3 from the head's cache after the previous step dropped its
    // chained entries, its QSA indexer state included (the indexer pools keys per block, so a
    // chained entry that completed a block must not stay pooled). Each first draft's logits
    // must be those of the head run once over every pair of the decided sequence (the main
    // model's streams), up to that step's token.
    let model = load_mtp(&fixture());
    let prompt = reference().ids("train_prompt_ids");
    let mut spec = Speculation::new(&model, 3).unwrap();
    let (mut cache, first) = speculation_start(&model, &mut spec, &prompt);
    let mut judge = FirstDrafts(vec![]);
    let mut positions = vec![prompt.len()];
    let out = speculate_to(
        &model,
        &mut spec,
        &mut cache,
        vec![first],
        48,
        &mut judge,
        |_, out| positions.push(prompt.len() + out.len() - 1),
    );
    let s = &spec.stats;
    assert!(s.accepted > 0 && s.accepted < s.drafted, "{s:?}");
    let seq: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    let streams = model.forward_normed(&seq, &mut model.new_cache()).unwrap();
    let all = head_logits_on(&model, &streams.squeeze(0).unwrap(), &seq);
    let mut worst = 0f32;
    for (logits, &p) in judge.0.iter().zip(&positions) {
        let got = Tensor::new(logits.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        worst = worst.max(rel_max_diff(&got, &all.narrow(0, p - 1, 1).unwrap()));
    }
    eprintln!(
        "{} steps ({} accepted of {} drafted): first drafts within {worst:.2e} of the head over every pair",
        judge.0.len(),
        s.accepted,
        s.drafted
    );
    assert!(worst < 1e-4, "{worst:.2e}");
}
