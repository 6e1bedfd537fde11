//! The engine with the fixtures' real chat templates: message boundaries, and greedy replies
//! of a conversation through the prompt cache equal those of a fresh engine, turn by turn.

use super::*;
use crate::engine::sampler::SamplerConfig;
use crate::load::{ComputeDtype, DeviceChoice, ModelArgs};
use crate::text::chat_template::ChatTemplate;
use qwen_gdn_model::RunOptions;
use serde_json::{json, Map, Value as Json};

// The fixtures' one list, shared with the integration tests of both crates.
#[path = "../../../qwen-gdn-model/tests/common/checkpoints.rs"]
mod checkpoints;
use checkpoints::CHECKPOINTS;

/// An engine on `models/<name>` (also used by `speculative_sampling.rs`'s tests).
pub(super) fn engine(name: &str, budget: u64) -> Engine {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/");
    let args = ModelArgs {
        model: format!("{dir}{name}"),
        revision: None,
        prefill_chunk_size: 16,
        gdn_state_dtype: None,
        device: DeviceChoice::Cpu,
        dtype: ComputeDtype::Auto,
        q8_activations: false,
        composed_decode: false,
    };
    let checkpoint = args.open().unwrap();
    let model = qwen_gdn_model::Model::load(
        &checkpoint.dir,
        &candle_core::Device::Cpu,
        &RunOptions::from_env().unwrap(),
    )
    .unwrap();
    Engine::new(checkpoint, model, 16, PromptCache::new(budget), None).unwrap()
}

fn template(engine: &Engine) -> ChatTemplate {
    let c = engine.checkpoint();
    ChatTemplate::from_dir(&c.dir, c.tokenizer_config.as_ref())
        .unwrap()
        .unwrap()
}

fn render(engine: &Engine, messages: &[Json]) -> PromptTokens {
    let mut vars = Map::new();
    vars.insert("enable_thinking".into(), true.into());
    render_conversation(
        &template(engine),
        &engine.checkpoint().tokenizer,
        messages,
        None,
        true,
        &vars,
    )
    .unwrap()
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        seed: Some(0),
        stop_strings: Vec::new(),
    }
}

fn reply(engine: &mut Engine, prompt: &PromptTokens) -> (Outcome, String) {
    let mut text = String::new();
    let outcome = engine
        .generate(prompt, &greedy(8), &AtomicBool::new(false), &mut |t| {
            text.push_str(t);
            ControlFlow::Continue(())
        })
        .unwrap();
    (outcome, text)
}

/// The text of the prompt up to each boundary.
fn boundary_texts(e: &Engine, p: &PromptTokens) -> Vec<String> {
    let tok = &e.checkpoint().tokenizer;
    p.boundaries
        .iter()
        .map(|&b| tok.decode(&p.ids[..b], false).unwrap())
        .collect()
}

#[test]
fn boundaries_are_message_ends_whose_tokens_prefix_the_prompt() {
    let e = engine("qwen3.5-tiny-4bit", 0);
    let messages = [
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "Hi there"}),
    ];
    let p = render(&e, &messages);
    // The system message alone makes Qwen3.5's template raise: its boundary comes from a
    // probe user message after it, and ends where the two user messages' texts part.
    let decoded = boundary_texts(&e, &p);
    assert_eq!(
        decoded,
        [
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n",
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n",
        ],
    );
    assert!(p.boundaries.iter().all(|&b| b < p.ids.len()));
}

/// A long conversation keeps the first message's end (a shared system prompt) and the ends of
/// its last messages only, so rendering it costs a bounded number of prefix renderings.
#[test]
fn a_long_conversation_keeps_the_first_and_the_recent_boundaries() {
    let e = engine("qwen3.5-tiny-4bit", 0);
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for turn in 0..20 {
        messages.push(json!({"role": "user", "content": format!("question {turn}")}));
        messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
    }
    messages.push(json!({"role": "user", "content": "last question"}));
    let p = render(&e, &messages);
    let decoded = boundary_texts(&e, &p);
    assert!(decoded[0].ends_with("You are terse.<|im_end|>\n<|im_start|>user\n"));
    let ends_with = |tail: &str| decoded.iter().any(|d| d.ends_with(tail));
    assert!(ends_with("last question<|im_end|>\n"), "{decoded:?}");
    assert!(ends_with("question 19<|im_end|>\n"), "{decoded:?}");
    assert!(p.boundaries.len() <= 2 + 2 * 4, "{}", p.boundaries.len());
    assert!(!decoded
        .iter()
        .any(|d| d.ends_with("question 5<|im_end|>\n")));
}

/// A conversation on one engine (its prompt cache shared across turns) replies exactly as a
/// fresh engine does to each turn's whole prompt; Qwen3.5's template drops the first reply's
/// reasoning, so turn 2 resumes mid-history.
#[test]
fn a_conversation_through_the_prompt_cache_is_exact() {
    for name in CHECKPOINTS {
        let mut cached = engine(name, 1 << 40);
        let mut messages = vec![
            json!({"role": "system", "content": "You answer in one word."}),
            json!({"role": "user", "content": "Name a colour."}),
        ];
        for turn in 0..3 {
            let prompt = render(&cached, &messages);
            let (got, text) = reply(&mut cached, &prompt);
            let (want, want_text) = reply(&mut engine(name, 1 << 40), &prompt);
            assert_eq!(got.tokens, want.tokens, "{name}: turn {turn}");
            assert_eq!(text, want_text, "{name}: turn {turn}");
            assert_eq!(want.cached_tokens, 0);
            if turn > 0 {
                assert!(
                    got.cached_tokens > prompt.boundaries[0],
                    "{name}: turn {turn} reused only {} of {} tokens",
                    got.cached_tokens,
                    prompt.ids.len()
                );
            }
            assert_eq!(got.prefilled_tokens, prompt.ids.len() - got.cached_tokens);
            messages.push(json!({
                "role": "assistant",
                "content": format!("<think>\nLet me think.\n</think>\n\n{text}"),
            }));
            messages.push(json!({"role": "user", "content": format!("And another? ({turn})")}));
        }
        // A new conversation sharing the system prompt resumes after it.
        let other = render(
            &cached,
            &[
                messages[0].clone(),
                json!({"role": "user", "content": "Name a fruit."}),
            ],
        );
        let (got, _) = reply(&mut cached, &other);
        let (want, _) = reply(&mut engine(name, 1 << 40), &other);
        assert_eq!(got.tokens, want.tokens, "{name}: shared system prompt");
        assert!(got.cached_tokens >= other.boundaries[0], "{name}");
    }
}

#[test]
fn stop_strings_and_cancel_end_a_reply() {
    let mut e = engine("qwen3.5-tiny-4bit", 1 << 40);
    let prompt = render(&e, &[json!({"role": "user", "content": "Hello"})]);
    let (full, text) = reply(&mut e, &prompt);
    assert_eq!(full.finish, FinishReason::Length);
    // Stop at the text's second character: only the first is emitted.
    let cut = text.char_indices().nth(1).map(|(i, _)| i).unwrap();
    let stop = text[cut..].chars().take(2).collect::<String>();
    let mut params = greedy(8);
    params.stop_strings = vec![stop.clone()];
    let mut out = String::new();
    let o = e
        .generate(&prompt, &params, &AtomicBool::new(false), &mut |t| {
            out.push_str(t);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(o.finish, FinishReason::Stop);
    assert_eq!(out, text[..text.find(&stop).unwrap()]);

    let cancel = AtomicBool::new(true);
    let o = e
        .generate(&prompt, &greedy(8), &cancel, &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!((o.finish, o.generated), (FinishReason::Cancelled, 0));
    // The cache stays consistent: the same request still gives the same reply.
    let (again, again_text) = reply(&mut e, &prompt);
    assert_eq!((again.tokens, again_text), (full.tokens, text));
}
