//! Speculative decoding with a separate draft model (issue 28, item 5): greedy output with
//! drafts equals greedy output without, for k = 1..4 and the adaptive length, with a draft
//! model that agrees with the main one (itself: every draft accepted, windows of several
//! calls), the same with every third draft spoiled (drafts rejected in the middle of the
//! window, the cache rewound into it) and one that never agrees (another architecture), on two
//! targets (qwen3-next and qwen3.5, each the other's disagreeing draft), and on qwen4_exp,
//! whose family state is rewound by replay;
//! after every step the draft model's
//! cache is bit for bit a cache that ran only the kept tokens, one decode step each.

mod common;
use common::*;
use qwen_gdn_model::speculative::{argmax, DraftLength, Judge, Speculation, ADAPTIVE_MAX};
use qwen_gdn_model::Model;
use std::sync::Arc;

/// Two targets of different architectures that share a tokenizer: each is the other's
/// draft model that disagrees with it often.
const NEXT: &str = "qwen3-next-tiny-bf16";
const QWEN35: &str = "qwen3.5-tiny-4bit";

/// Greedy decisions; greedy drafts, but every third one replaced by the next token id when
/// `spoil` is set (so that a draft model agreeing with the main one still has drafts
/// rejected in the middle of its window).
struct TestJudge {
    spoil: bool,
    drafted: usize,
}

impl Judge for TestJudge {
    fn draft(&mut self, logits: &mut [f32], _before: &[u32]) -> u32 {
        self.drafted += 1;
        let best = argmax(logits);
        match self.spoil && self.drafted.is_multiple_of(3) {
            true => (best + 1) % logits.len() as u32,
            false => best,
        }
    }

    fn decide(&mut self, logits: &mut [f32], _before: &[u32], _draft: Option<u32>) -> u32 {
        argmax(logits)
    }
}

/// The draft model's cache after a step must be one that ran the prompt but its last token,
/// then the sequence's tokens it has seen (`sequence` = the prompt's last token, then every
/// decided token), one decode step each.
fn assert_draft_cache_exact(draft: &Model, spec: &Speculation, prompt: &[u32], sequence: &[u32]) {
    let (cache, unseen) = spec.draft_model().unwrap().state();
    let mut want = draft.new_cache();
    draft
        .prefill(&prompt[..prompt.len() - 1], &mut want, 2048)
        .unwrap();
    let seen = cache.offset - want.offset;
    for &t in &sequence[..seen] {
        draft.forward_last(&[t], &mut want).unwrap();
    }
    assert_eq!(
        unseen,
        &sequence[seen..seen + unseen.len()],
        "the tokens the draft model has not run follow those it has"
    );
    let (got, want) = (layer_states(cache), layer_states(&want));
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "after {seen} tokens: tensor {i} of the draft model's cache differs from one that ran only the kept tokens");
    }
}

/// Greedy decoding of `n` tokens with drafts from `draft`; checks the draft model's cache
/// after every step.
fn speculative_greedy(
    main: &Model,
    draft: &Arc<Model>,
    prompt: &[u32],
    n: usize,
    length: DraftLength,
    spoil: bool,
) -> (Vec<u32>, Speculation) {
    let mut spec = Speculation::with_draft_model(main, draft.clone(), 2048, length).unwrap();
    let mut cache = main.new_cache();
    let split = prompt.len() - 1;
    main.prefill(&prompt[..split], &mut cache, 2048).unwrap();
    let logits = spec
        .start_from_prompt(main, &mut cache, prompt, split)
        .unwrap();
    let first = vec![argmax_rows(&logits)[0]];
    let mut judge = TestJudge { spoil, drafted: 0 };
    let out = speculate_to(
        main,
        &mut spec,
        &mut cache,
        first,
        n,
        &mut judge,
        |spec, out| {
            let sequence: Vec<u32> = [prompt[split]].iter().chain(out).copied().collect();
            assert_draft_cache_exact(draft, spec, prompt, &sequence);
        },
    );
    (out, spec)
}

#[test]
fn greedy_output_with_a_draft_model_equals_greedy_output_without() {
    greedy_output_is_kept_with_drafts_for(NEXT, QWEN35);
}

#[test]
fn greedy_output_with_a_draft_model_equals_greedy_output_without_on_a_second_target() {
    greedy_output_is_kept_with_drafts_for(QWEN35, NEXT);
}

/// A target whose cache holds a family's own layer state (`qwen4_exp`: the PLE window and
/// the QSA indexer's keys), which windows rewind by replay: as main model and as its own
/// draft model.
#[test]
fn greedy_output_with_a_draft_model_equals_greedy_output_without_on_qwen4_exp() {
    greedy_output_is_kept_with_drafts_for(QWEN4_EXP[0], QWEN35);
}

/// Greedy decoding of `target` with drafts from itself (spoiled or not) and from `other`.
fn greedy_output_is_kept_with_drafts_for(target: &str, other_name: &str) {
    let main = load(target);
    let prompt = Reference::load(target).ids("tf_ids")[..12].to_vec();
    let want = greedy(&main, &prompt, 64);
    let itself = Arc::new(load(target));
    let other = Arc::new(load(other_name));
    for (name, draft, spoil) in [
        (target, &itself, false),
        (target, &itself, true),
        (other_name, &other, false),
    ] {
        let lengths = (1..=4)
            .map(DraftLength::Fixed)
            .chain([DraftLength::adaptive(ADAPTIVE_MAX)]);
        for length in lengths {
            eprintln!("case: target {target}, draft {name}, spoil {spoil}, {length}");
            let (got, spec) = speculative_greedy(&main, draft, &prompt, 64, length.clone(), spoil);
            let what = format!(
                "target {target}, draft {name}{}, {length}",
                if spoil { " spoiled" } else { "" }
            );
            assert_eq!(got, want, "{what}: tokens");
            let s = &spec.stats;
            eprintln!(
                "{what}: acceptance {:.3} ({} of {} drafts), {:.2} tokens per verify step",
                s.acceptance(),
                s.accepted,
                s.drafted,
                s.tokens_per_step()
            );
            match (name == target, spoil) {
                // The main model drafting for itself: its drafts are its own greedy tokens.
                (true, false) => assert!(s.acceptance() > 0.95, "{what}: {s:?}"),
                // Spoiled drafts are rejected, the others kept: rewinds into the window.
                (true, true) if length != DraftLength::Fixed(1) => {
                    assert!(0 < s.accepted && s.accepted < s.drafted, "{what}: {s:?}")
                }
                _ => assert!(s.accepted < s.drafted, "{what}: {s:?}"),
            }
        }
    }
}
