//! The reply loop's step modes (replies.rs, `StepMode`) with speculative decoding: a reply
//! speculates while it decodes alone, takes the batch's plain steps beside another, and
//! speculates again once alone. Its head must then draft exactly as the model's own API
//! drives it through the same schedule (`Speculation::step` alone, a plain step's normed
//! hidden state through `Speculation::record_plain` beside another; that pair is checked
//! against steps without drafts and the head's one-call forward in qwen-gdn-model's
//! tests/mtp.rs): same tokens, same drafts accepted at every index.

use super::tests::engine;
use super::*;
use crate::engine::sampler::argmax;
use qwen_gdn_model::speculative::Greedy;

/// A reply's sink that wants everything and never cancels.
struct Keep;

impl ReplySink for Keep {
    fn text(&mut self, _: &str) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }

    fn cancelled(&self) -> bool {
        false
    }
}

fn params(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        seed: Some(0),
        stop_strings: Vec::new(),
    }
}

fn tokens(engine: &Engine, text: &str) -> PromptTokens {
    let ids = engine.checkpoint().tokenizer.encode(text, true).unwrap();
    PromptTokens::plain(ids.get_ids().to_vec())
}

/// A's tokens and speculation counts through the model's API: `alone` speculative steps,
/// `beside` plain steps, then speculative steps to `max_tokens`.
fn replayed(
    model: &Model,
    prompt: &[u32],
    max_tokens: usize,
    alone: usize,
    beside: usize,
) -> (Vec<u32>, SpecStats) {
    let mut spec = Speculation::new(model, DraftLength::Fixed(2)).unwrap();
    let mut cache = model.new_cache();
    let logits = spec
        .start_from_prompt(model, &mut cache, prompt, 0)
        .unwrap();
    let mut out = vec![argmax(&last_row(&logits).unwrap())];
    let mut judge = Greedy(|row: &mut [f32], _: &[u32]| argmax(row));
    let mut step = 0;
    while out.len() < max_tokens {
        let token = *out.last().unwrap();
        if (alone..alone + beside).contains(&step) {
            let normed = model.forward_normed(&[token], &mut cache).unwrap();
            spec.record_plain(model, token, &normed).unwrap();
            out.push(argmax(
                &last_row(&model.head_logits(&normed).unwrap()).unwrap(),
            ));
        } else {
            let room = max_tokens - out.len() - 1;
            out.extend(
                spec.step(model, &mut cache, token, room, &mut judge)
                    .unwrap(),
            );
        }
        step += 1;
    }
    (out, spec.stats)
}

#[test]
fn a_reply_speculates_alone_and_keeps_its_head_through_batched_steps() {
    let mut e = engine("mtp/qwen3.5-mtp-tiny-hf", 0);
    let dir = e.checkpoint().dir.clone();
    assert!(e.model.load_mtp(&dir).unwrap());
    e.set_draft_length(Some(DraftLength::Fixed(2))).unwrap();
    let (a, b) = (tokens(&e, "The sea is"), tokens(&e, "Once upon a time"));
    let mut replies = Replies::new();
    replies
        .add(&mut e, 'a', &a, &params(40), None, Keep)
        .unwrap();
    // Step 1: A's prompt, then its first speculative step; step 2: another one.
    let mut ended = vec![];
    for _ in 0..2 {
        ended.extend(replies.step(&mut e));
    }
    // B joins in step 3 (its prompt in one piece) and decodes beside A until its 5th token:
    // 4 plain steps of both.
    replies
        .add(&mut e, 'b', &b, &params(5), None, Keep)
        .unwrap();
    while replies.len() == 2 {
        ended.extend(replies.step(&mut e));
    }
    let Some(('b', Ok(b_outcome))) = ended.pop() else {
        panic!("B did not end first");
    };
    assert_eq!(b_outcome.generated, 5);
    while !replies.is_empty() {
        ended.extend(replies.step(&mut e));
    }
    let Some(('a', Ok(a_outcome))) = ended.pop() else {
        panic!("A did not end");
    };
    let (want, stats) = replayed(&e.model, &a.ids, 40, 2, 4);
    assert_eq!(a_outcome.tokens, want);
    let got = a_outcome.speculation.unwrap();
    assert_eq!(got, stats);
    assert!(got.accepted > 0, "{got:?}");
    // B speculated only in its plain steps: no verify step of its own.
    assert_eq!(b_outcome.speculation.unwrap().steps, 0);
}
