//! The multi-token-prediction head and greedy speculative decoding (issue 28) on the MTP
//! fixtures (scripts/gen_fixture_mtp.py): the head's logits against the torch reference,
//! both norm conventions, shape errors, greedy output with speculation equal to without, and
//! the exactness of the rollback after a rejected draft.

mod common;
use candle_core::{Device, Tensor};
use common::*;
use qwen_gdn_model::cache::LayerCache;
use qwen_gdn_model::speculative::{DraftLength, Speculation, Window, ADAPTIVE_MAX};
use qwen_gdn_model::{Batch, Model, MtpPrecision};
use std::path::PathBuf;

/// The raw HF fixtures with a torch reference (the first one's head is the best trained).
const RAW: [&str; 3] = [
    "qwen3.5-mtp-tiny-hf",
    "qwen3-next-mtp-tiny-hf",
    "qwen3.5-moe-mtp-tiny-hf",
];
/// The MLX twin of the first: 4-bit, its head quantized with shifted norms.
const MLX: &str = "qwen3.5-mtp-tiny-4bit";

/// The MTP fixtures' own folder (the tests that walk models/ expect the mlx-lm ones only).
fn mtp_dir(name: &str) -> PathBuf {
    models_dir().join("mtp").join(name)
}

fn load(name: &str) -> Model {
    Model::load(&mtp_dir(name), &Device::Cpu, &run_options())
        .unwrap_or_else(|e| panic!("loading {name}: {e:#}"))
}

fn load_mtp(name: &str) -> Model {
    let mut model = load(name);
    assert!(
        model.load_mtp(&mtp_dir(name)).unwrap(),
        "{name}: no MTP head found"
    );
    model
}

fn reference(name: &str) -> Reference {
    let path = mtp_dir("reference").join(format!("{name}.safetensors"));
    Reference(
        candle_core::safetensors::load(&path, &Device::Cpu)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

/// The head over the recorded pairs (the torch hidden states and ids), all at once.
fn head_logits_on(model: &Model, reference: &Reference) -> Tensor {
    let ids = reference.ids("ids");
    let hidden = reference.get("hidden");
    let n = ids.len();
    let hidden = hidden.narrow(0, 0, n - 1).unwrap().unsqueeze(0).unwrap();
    let mut cache = model.mtp_head().unwrap().new_cache();
    let g = model.mtp_forward(&hidden, &ids[1..], &mut cache).unwrap();
    model.head_logits(&g).unwrap()
}

fn rows(t: &Tensor, positions: &[u32]) -> Tensor {
    let idx = Tensor::new(positions, t.device()).unwrap();
    t.index_select(&idx, 0).unwrap()
}

#[test]
fn head_logits_match_the_torch_reference() {
    for name in RAW {
        let model = load_mtp(name);
        let reference = reference(name);
        let positions = reference.ids("head_positions");
        let want = reference.get("head_logits");
        // The head alone, on the reference's own hidden states.
        let got = rows(&head_logits_on(&model, &reference), &positions);
        let err = rel_max_diff(&got, want);
        assert!(
            err < 1e-4,
            "{name}: head logits off by {err:.2e} of max|logit|"
        );
        // End to end: our main model's hidden states into our head.
        let ids = reference.ids("ids");
        let mut cache = model.new_cache();
        let normed = model.forward_normed(&ids, &mut cache).unwrap();
        let hidden_err = rel_max_diff(&normed.squeeze(0).unwrap(), reference.get("hidden"));
        assert!(
            hidden_err < 1e-4,
            "{name}: hidden states off by {hidden_err:.2e}"
        );
        let main = rows(&model.head_logits(&normed).unwrap(), &positions);
        let main_err = rel_max_diff(&main, reference.get("main_logits"));
        assert!(main_err < 1e-4, "{name}: main logits off by {main_err:.2e}");
        let n = ids.len();
        let mut head_cache = model.mtp_head().unwrap().new_cache();
        let g = model
            .mtp_forward(
                &normed.narrow(1, 0, n - 1).unwrap(),
                &ids[1..],
                &mut head_cache,
            )
            .unwrap();
        let e2e = rows(&model.head_logits(&g).unwrap(), &positions);
        let err = rel_max_diff(&e2e, want);
        assert!(
            err < 1e-4,
            "{name}: end-to-end head logits off by {err:.2e}"
        );
        eprintln!("{name}: head {err:.2e}, hidden {hidden_err:.2e}, main {main_err:.2e}");
    }
}

#[test]
fn head_runs_the_same_one_pair_at_a_time() {
    let name = RAW[0];
    let model = load_mtp(name);
    let reference = reference(name);
    let all = head_logits_on(&model, &reference);
    let ids = reference.ids("ids");
    let hidden = reference.get("hidden").unsqueeze(0).unwrap();
    let mut cache = model.mtp_head().unwrap().new_cache();
    let mut steps = vec![];
    for i in 0..ids.len() - 1 {
        let h = hidden.narrow(1, i, 1).unwrap();
        let g = model
            .mtp_forward(&h, &ids[i + 1..i + 2], &mut cache)
            .unwrap();
        steps.push(model.head_logits(&g).unwrap());
    }
    let steps = Tensor::cat(&steps, 0).unwrap();
    let err = rel_max_diff(&steps, &all);
    assert!(
        err < 1e-5,
        "{name}: one pair at a time differs by {err:.2e}"
    );
}

/// How two heads' logits on the same inputs differ: max |got − want| / max |want|, and the
/// share of rows whose top token is the same.
fn compare_heads(got: &Tensor, want: &Tensor) -> (f32, f64) {
    let agree = argmax_rows(got)
        .iter()
        .zip(argmax_rows(want))
        .filter(|(a, b)| **a == *b)
        .count() as f64
        / want.dim(0).unwrap() as f64;
    (rel_max_diff(got, want), agree)
}

#[test]
fn shifted_and_zero_centred_head_norms_are_both_read_right() {
    // The raw fixture stores its head's norms zero-centred (1 + w), the MLX twin stores the
    // same head shifted and quantized: on the same inputs their logits agree (within what
    // 4-bit weights change); a norm read in the wrong convention would scale its output by
    // about 1 ± w instead and break the agreement.
    let raw = load_mtp(RAW[0]);
    let mlx = load_mtp(MLX);
    let reference = reference(RAW[0]);
    let want = head_logits_on(&raw, &reference);
    let got = head_logits_on(&mlx, &reference);
    let (err, agree) = compare_heads(&got, &want);
    eprintln!("4-bit head vs raw head: {err:.3} of max|logit|, top-1 agreement {agree:.3}");
    assert!(err < 0.35 && agree > 0.7, "err {err}, agreement {agree}");
}

#[test]
fn a_float_head_is_quantized_to_the_main_checkpoints_bits_on_load() {
    // `--mtp-from` the raw checkpoint for its 4-bit conversion: the same raw head, kept as
    // stored and quantized on load to 4 bits, group 64 (the twin's config). The quantized one
    // differs by what 4-bit weights change (zero would mean nothing was quantized) and still
    // drafts the same tokens mostly.
    let mut stored = load(MLX);
    assert!(stored
        .load_mtp_with(&mtp_dir(RAW[0]), MtpPrecision::AsStored)
        .unwrap());
    let mut quantized = load(MLX);
    assert!(quantized
        .load_mtp_with(&mtp_dir(RAW[0]), MtpPrecision::MainBits)
        .unwrap());
    let reference = reference(RAW[0]);
    let want = head_logits_on(&stored, &reference);
    let got = head_logits_on(&quantized, &reference);
    let (err, agree) = compare_heads(&got, &want);
    eprintln!(
        "head quantized on load vs as stored: {err:.3} of max|logit|, top-1 agreement {agree:.3}"
    );
    assert!(
        err > 1e-3 && err < 0.35 && agree > 0.7,
        "err {err}, agreement {agree}"
    );
    // A raw (unquantized) main checkpoint keeps its head as stored whatever is asked.
    let mut raw = load(RAW[0]);
    assert!(raw
        .load_mtp_with(&mtp_dir(RAW[0]), MtpPrecision::MainBits)
        .unwrap());
    let as_stored = load_mtp(RAW[0]);
    let same = rel_max_diff(
        &head_logits_on(&raw, &reference),
        &head_logits_on(&as_stored, &reference),
    );
    assert_eq!(same, 0.0);
}

#[test]
fn checkpoints_without_a_head_say_so_and_keep_their_warning() {
    let dir = models_dir().join("qwen3.5-moe-tiny-4bit");
    let mut model = common::load("qwen3.5-moe-tiny-4bit");
    assert!(!model.load_mtp(&dir).unwrap());
    assert!(model.mtp_head().is_none());
    assert!(Speculation::new(&model, 2).is_err());
}

#[test]
fn loading_the_head_drops_the_skipped_mtp_warning() {
    let name = RAW[0];
    let model = load(name);
    assert!(model.load_warnings().iter().any(|w| w.contains("mtp.*")));
    let model = load_mtp(name);
    assert!(
        !model.load_warnings().iter().any(|w| w.contains("mtp.*")),
        "{:?}",
        model.load_warnings()
    );
}

#[test]
fn a_head_whose_shapes_disagree_with_the_config_is_a_one_line_error() {
    let (_tmp, dir) = scratch_copy(&mtp_dir(RAW[0]));
    // mtp.fc.weight is [H, 2H] = [128, 256]; declare it [256, 128] (same bytes).
    reshape_in_header(&dir.join("model.safetensors"), "mtp.fc.weight", &[256, 128]);

    let mut model = Model::load(&dir, &Device::Cpu, &run_options()).unwrap();
    let msg = format!("{:#}", model.load_mtp(&dir).unwrap_err());
    assert!(!msg.contains('\n'), "not one line: {msg}");
    assert!(
        msg.contains("mtp.fc.weight") && msg.contains("expected [128, 256]"),
        "{msg}"
    );
}

#[test]
fn greedy_output_with_speculation_equals_greedy_output_without() {
    for name in RAW.iter().copied().chain([MLX]) {
        let model = load_mtp(name);
        let prompt = reference(RAW[0]).ids("ids")[..12].to_vec();
        let want = greedy(&model, &prompt, 64);
        let lengths = (1..=4)
            .map(DraftLength::Fixed)
            .chain([DraftLength::adaptive(ADAPTIVE_MAX)]);
        for length in lengths {
            let (got, spec) = speculative_greedy(&model, &prompt, 64, length.clone());
            assert_eq!(got, want, "{name}: {length}");
            let s = &spec.stats;
            eprintln!(
                "{name} {length}: acceptance {:.3}, {:.2} tokens per verify step ({} steps), per draft index {:?}/{:?}, steps per k {:?}",
                s.acceptance(),
                s.tokens_per_step(),
                s.steps,
                s.accepted_at,
                s.drafted_at,
                s.steps_at
            );
        }
    }
}

#[test]
fn the_trained_head_is_accepted_often() {
    let model = load_mtp(RAW[0]);
    let prompt = reference(RAW[0]).ids("ids")[..12].to_vec();
    let (_, spec) = speculative_greedy(&model, &prompt, 64, 1);
    // The head agreed with the main model on 54% of the reference's positions in torch.
    assert!(spec.stats.acceptance() > 0.3, "{:?}", spec.stats);
}

/// The adaptive length drafts more where the head is accepted more: on the trained dense head
/// (acceptance about 0.8 at fixed k) about 3 tokens per step; on the 4-bit twin (whose main
/// model the head was not trained on, about 0.5 at k = 1) fewer than 2, since at the rule's
/// cost of 0.2 per draft a second draft pays only above an acceptance of 0.5.
#[test]
fn the_adaptive_length_follows_the_heads_acceptance() {
    let prompt = reference(RAW[0]).ids("ids")[..12].to_vec();
    let mean_k = |name: &str| {
        let model = load_mtp(name);
        let (_, spec) =
            speculative_greedy(&model, &prompt, 64, DraftLength::adaptive(ADAPTIVE_MAX));
        let s = &spec.stats;
        assert_eq!(s.steps_at.iter().sum::<usize>(), s.steps);
        eprintln!(
            "{name}: acceptance {:.3}, steps per k {:?}",
            s.acceptance(),
            s.steps_at
        );
        s.mean_draft_tokens()
    };
    let trained = mean_k(RAW[0]);
    let twin = mean_k(MLX);
    assert!(trained > 2.5, "{trained}");
    assert!(twin < 2.0, "{twin}");
}

#[test]
fn rollback_after_a_rejected_draft_is_exact() {
    let model = load(RAW[0]);
    let prompt = reference(RAW[0]).ids("ids")[..12].to_vec();
    let window = [101u32, 202, 303, 404];
    let mut base = model.new_cache();
    model.prefill(&prompt, &mut base, 2048).unwrap();
    for kept in 1..=window.len() {
        // The verify pass sees all four tokens, then keeps `kept`.
        let mut rolled = base.deep_clone().unwrap();
        let w = Window::open(&mut rolled).unwrap();
        model.forward_normed(&window, &mut rolled).unwrap();
        w.close(&mut rolled, kept).unwrap();
        assert_eq!(rolled.offset, prompt.len() + kept);
        // A cache that never saw the rejected tokens: the kept ones one decode step at a time,
        // as non-speculative decoding runs them.
        let mut decoded = base.deep_clone().unwrap();
        for &t in &window[..kept] {
            model.forward_last(&[t], &mut decoded).unwrap();
        }
        assert_eq!(decoded.offset, rolled.offset);
        let (a, b) = (gdn_and_kv(&rolled), gdn_and_kv(&decoded));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.len(), y.len(), "kept {kept}: tensor {i} has another size");
            let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same,
                "kept {kept}: tensor {i} differs from the decoded cache"
            );
        }
        // And the next token's logits are the same, bit for bit.
        let l1 = model.forward_last(&[7], &mut rolled).unwrap();
        let l2 = model.forward_last(&[7], &mut decoded).unwrap();
        assert_eq!(flat(&l1), flat(&l2), "kept {kept}: next logits differ");
    }
}

#[test]
fn a_closed_window_leaves_no_recording_behind() {
    let model = load(RAW[0]);
    let mut cache = model.new_cache();
    model.prefill(&[1, 2, 3], &mut cache, 2048).unwrap();
    let w = Window::open(&mut cache).unwrap();
    model.forward_normed(&[4, 5], &mut cache).unwrap();
    w.close(&mut cache, 1).unwrap();
    for layer in &cache.layers {
        if let LayerCache::Gdn(c) = layer {
            assert!(c.steps.is_none());
        }
    }
    // Keeping more tokens than the window saw is refused.
    let w = Window::open(&mut cache).unwrap();
    model.forward_normed(&[6], &mut cache).unwrap();
    assert!(w.close(&mut cache, 2).is_err());
}

/// `serve` decodes a speculating reply in the batch's plain steps while others decode
/// (`Speculation::record_plain` with its row's normed hidden state), speculatively when it is
/// alone. After 70 plain steps beside another sequence (past `HEAD_HISTORY` pending pairs, so
/// the head's catch-up runs once) the head must be where 70 speculative steps that drafted
/// nothing leave it: the next steps' first drafts have the same logits, bit for bit, and they
/// are the head's logits over every pair of the text in one call (the torch-checked forward).
#[test]
fn plain_batched_steps_leave_the_head_as_steps_without_drafts() {
    let model = load_mtp(RAW[0]);
    let prompt = reference(RAW[0]).ids("ids")[..12].to_vec();
    let plain_steps = 70;
    let speculative_steps = 4;

    // A: speculative steps that draft nothing, then speculative steps of 2 drafts.
    let mut a = Speculation::new(&model, 2).unwrap();
    let (mut cache, first) = speculation_start(&model, &mut a, &prompt);
    let mut judge_a = FirstDrafts::default();
    let mut tokens_a = vec![first];
    for step in 0..plain_steps + speculative_steps {
        let max_draft = if step < plain_steps { 0 } else { 2 };
        let token = *tokens_a.last().unwrap();
        let decided = a.step(&model, &mut cache, token, max_draft, &mut judge_a);
        tokens_a.extend(decided.unwrap());
    }

    // B: batched steps beside another sequence, then the same speculative steps.
    let mut b = Speculation::new(&model, 2).unwrap();
    let (cache, first) = speculation_start(&model, &mut b, &prompt);
    let mut batch = Batch::new();
    let slot = batch.join(cache);
    let mut other = model.new_cache();
    model.prefill(&prompt[..5], &mut other, 2048).unwrap();
    let beside = batch.join(other);
    let (mut tokens_b, mut other_next) = (vec![first], prompt[5]);
    for _ in 0..plain_steps {
        let token = *tokens_b.last().unwrap();
        let (logits, normed) = batch
            .step_normed(&model, &[(slot, token), (beside, other_next)])
            .unwrap();
        b.record_plain(&model, token, &normed.narrow(1, 0, 1).unwrap())
            .unwrap();
        let picks = argmax_rows(&logits);
        tokens_b.push(picks[0]);
        other_next = picks[1];
    }
    assert_eq!(tokens_b[..], tokens_a[..=plain_steps], "the plain tokens");
    let mut cache = batch.leave(slot).unwrap();
    let mut judge_b = FirstDrafts::default();
    for _ in 0..speculative_steps {
        let token = *tokens_b.last().unwrap();
        let decided = b.step(&model, &mut cache, token, 2, &mut judge_b);
        tokens_b.extend(decided.unwrap());
    }
    assert_eq!(tokens_b, tokens_a);
    assert_eq!(judge_a.0.len(), speculative_steps);
    assert_eq!(judge_b.0, judge_a.0, "the first drafts' logits");
    assert_eq!(b.stats.accepted, a.stats.accepted);

    // The first draft after the plain steps: the head over every pair (hidden state of
    // position i, token i + 1) of the text so far, in one call.
    let text: Vec<u32> = prompt
        .iter()
        .chain(&tokens_a[..=plain_steps])
        .copied()
        .collect();
    let n = text.len() - 1;
    let normed = model
        .forward_normed(&text[..n], &mut model.new_cache())
        .unwrap();
    let g = model
        .mtp_forward(
            &normed,
            &text[1..],
            &mut model.mtp_head().unwrap().new_cache(),
        )
        .unwrap();
    let want = model.head_logits(&g.narrow(1, n - 1, 1).unwrap()).unwrap();
    let got = Tensor::new(&judge_a.0[0][..], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let (diff, agree) = compare_heads(&got, &want);
    assert!(
        diff < 1e-4 && agree == 1.0,
        "{diff} of max|logit|, top-1 {agree}"
    );
}
