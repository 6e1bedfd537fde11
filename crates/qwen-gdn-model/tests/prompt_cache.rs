//! The prompt cache is exact: greedy output of a request that resumes from a snapshot is
//! token for token (and its first logits bit for bit) that of the same request run from
//! scratch, on every fixture (qwen4_exp's too: its snapshots carry the n-gram context, the
//! PLE conv window and the QSA indexer's block keys). Restored caches never share storage
//! with the snapshot, and eviction keeps the byte budget.

mod common;
use candle_core::{DType, Tensor};
use common::*;
use qwen_gdn_model::cache::LayerCache;
use qwen_gdn_model::families::qwen4_exp::state::{indexer, ple};
use qwen_gdn_model::{prefill_with_snapshots, Cache, Model, Plan, PromptCache, RunOptions};

const CHUNK: usize = 16;
const DECODE: usize = 8;
const BIG: u64 = 1 << 40;

/// Every fixture: the mlx-lm ones and qwen4_exp's two (raw HF and mlx-vlm 4-bit), whose QSA
/// budget (8 tokens) every prompt here exceeds.
fn reference_plan_checkpoints() -> impl Iterator<Item = &'static str> {
    CHECKPOINTS.into_iter().chain(QWEN4_EXP)
}

/// A fixed pseudo-random token sequence (an LCG) of `n` ids below the vocabulary size.
fn text(model: &Model, seed: u64, n: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size as u64;
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab) as u32
        })
        .collect()
}

/// What one request gave.
struct Run {
    /// Prompt tokens restored from the cache.
    cached: usize,
    /// Logits of the last prompt token.
    first_logits: Vec<f32>,
    tokens: Vec<u32>,
}

/// The engine's flow: look up, prefill the rest with snapshots at `boundaries` (and every
/// `every` tokens), run the last token alone, snapshot the prompt's end, decode greedily.
fn request(
    model: &Model,
    pc: &mut PromptCache,
    ids: &[u32],
    boundaries: &[usize],
    every: Option<usize>,
) -> Run {
    let (cached, mut cache) = pc
        .lookup(ids)
        .unwrap()
        .unwrap_or_else(|| (0, model.new_cache()));
    assert_eq!(cache.offset, cached);
    let (head, last) = ids.split_at(ids.len() - 1);
    prefill_with_snapshots(model, head, &mut cache, CHUNK, boundaries, every, pc).unwrap();
    let mut logits = model.forward_last(last, &mut cache).unwrap();
    pc.insert(ids, &cache).unwrap();
    let first_logits = flat(&logits);
    let mut tokens = vec![];
    for _ in 0..DECODE {
        let token = argmax_rows(&logits)[0];
        tokens.push(token);
        logits = model.forward_last(&[token], &mut cache).unwrap();
    }
    Run {
        cached,
        first_logits,
        tokens,
    }
}

/// The same request on an empty cache.
fn uncached(model: &Model, ids: &[u32], boundaries: &[usize], every: Option<usize>) -> Run {
    request(model, &mut PromptCache::new(BIG), ids, boundaries, every)
}

fn assert_same(name: &str, what: &str, got: &Run, want: &Run) {
    assert_eq!(
        got.tokens, want.tokens,
        "{name}: {what}: greedy tokens differ"
    );
    assert!(
        got.first_logits == want.first_logits,
        "{name}: {what}: first logits differ"
    );
}

/// A snapshot position at the very end of the tokens given is taken once: the token before it
/// runs once (it ran twice, and the snapshot was refused, when speculative decoding's prompt
/// ended its prefilled part at a message boundary).
#[test]
fn a_snapshot_at_the_end_of_the_tokens_is_taken_once() {
    let name = reference_plan_checkpoints().next().unwrap();
    let model = load(name);
    let ids = text(&model, 1, 20);
    let mut pc = PromptCache::new(BIG);
    let mut cache = model.new_cache();
    prefill_with_snapshots(&model, &ids, &mut cache, CHUNK, &[12, 20], None, &mut pc).unwrap();
    assert_eq!(cache.offset, 20);
    let longer = [ids.clone(), text(&model, 2, 5)].concat();
    assert_eq!(pc.lookup(&longer).unwrap().map(|(n, _)| n), Some(20));
}

/// (a) A second request that shares the system prompt resumes at its end.
#[test]
fn second_request_sharing_a_system_prompt_is_exact() {
    for name in reference_plan_checkpoints() {
        let model = load(name);
        let system = text(&model, 1, 37);
        let first: Vec<u32> = [system.clone(), text(&model, 2, 23)].concat();
        let second: Vec<u32> = [system.clone(), text(&model, 3, 29)].concat();
        let boundaries = [system.len()];
        let mut pc = PromptCache::new(BIG);
        request(&model, &mut pc, &first, &boundaries, None);
        let got = request(&model, &mut pc, &second, &boundaries, None);
        assert_eq!(got.cached, system.len(), "{name}");
        assert_same(
            name,
            "shared system prompt",
            &got,
            &uncached(&model, &second, &boundaries, None),
        );
    }
}

/// (b) A chat whose template rewrites history: the second turn renders the first reply
/// without its reasoning, so the prompt diverges from the first turn's prompt + reply right
/// after the assistant header; the turn resumes at the end of the first user message, and
/// the third turn (history not rewritten) at the end of the second prompt.
#[test]
fn multi_turn_chat_whose_template_rewrites_history_is_exact() {
    for name in reference_plan_checkpoints() {
        multi_turn_chat(name, &load(name));
    }
}

/// The same on the device plan (bf16 activations; the CPU, or the GPU with
/// `QWEN_GDN_TEST_DEVICE=cuda`), whose decode steps run the fused kernels (qwen4_exp's the
/// composed ops).
#[test]
fn multi_turn_chat_is_exact_on_the_device_plan() {
    let opts = RunOptions {
        dtype: DType::BF16,
        ..common::run_options()
    };
    for name in reference_plan_checkpoints() {
        let model = load_on(name, &opts, &device_under_test());
        assert_eq!(model.plan(), Plan::Device);
        multi_turn_chat(name, &model);
    }
}

fn multi_turn_chat(name: &str, model: &Model) {
    let system = text(model, 11, 30);
    let user1 = text(model, 12, 20);
    let header = text(model, 13, 3); // <|im_start|>assistant\n
    let think = text(model, 14, 2); // <think>\n
    let turn1: Vec<u32> = [&system[..], &user1, &header, &think].concat();
    let b1 = vec![system.len(), system.len() + user1.len()];
    let mut pc = PromptCache::new(BIG);
    let reply1 = request(model, &mut pc, &turn1, &b1, None).tokens;

    // History as the template writes it: the reply without the reasoning it began with.
    let answer1 = &reply1[DECODE / 2..];
    let user2 = text(model, 15, 17);
    let turn2: Vec<u32> = [
        &system[..],
        &user1,
        &header,
        answer1,
        &user2,
        &header,
        &think,
    ]
    .concat();
    let end_of_user1 = system.len() + user1.len();
    let end_of_answer1 = end_of_user1 + header.len() + answer1.len();
    let end_of_user2 = end_of_answer1 + user2.len();
    let b2 = vec![system.len(), end_of_user1, end_of_answer1, end_of_user2];
    let got = request(model, &mut pc, &turn2, &b2, None);
    assert_eq!(
        got.cached, end_of_user1,
        "{name}: turn 2 resumes mid-history"
    );
    assert_same(name, "turn 2", &got, &uncached(model, &turn2, &b2, None));

    let user3 = text(model, 16, 11);
    let turn3: Vec<u32> = [&turn2[..], &got.tokens, &user3, &header, &think].concat();
    let mut b3 = b2.clone();
    b3.extend([turn2.len(), turn2.len() + DECODE + user3.len()]);
    let got3 = request(model, &mut pc, &turn3, &b3, None);
    assert_eq!(
        got3.cached,
        turn2.len(),
        "{name}: turn 3 resumes at turn 2's end"
    );
    assert_same(name, "turn 3", &got3, &uncached(model, &turn3, &b3, None));
}

/// (c) A prefix that ends between two snapshots resumes from the earlier one; a long prompt
/// with snapshots every N tokens, resumed past the KV buffers' first growth (256 positions).
#[test]
fn prefix_ending_between_two_snapshots_is_exact() {
    let every = Some(64);
    for name in reference_plan_checkpoints() {
        let model = load(name);
        let shared = text(&model, 21, 281);
        let first: Vec<u32> = [&shared[..], &text(&model, 22, 19)].concat();
        let second: Vec<u32> = [&shared[..], &text(&model, 23, 24)].concat();
        let mut pc = PromptCache::new(BIG);
        request(&model, &mut pc, &first, &[], every);
        assert_eq!(pc.snapshot_lengths(), vec![64, 128, 192, 256, first.len()]);
        let got = request(&model, &mut pc, &second, &[], every);
        assert_eq!(got.cached, 256, "{name}");
        assert_same(
            name,
            "between snapshots",
            &got,
            &uncached(&model, &second, &[], every),
        );
    }
}

/// Every cached tensor, KV trimmed to its length; qwen4_exp's PLE window and n-gram context
/// and its indexer's block and tail keys (on the host) as tensors too.
fn tensors(cache: &Cache) -> Vec<Tensor> {
    let host = |v: Vec<f32>| Tensor::new(v, &candle_core::Device::Cpu).unwrap();
    cache
        .layers
        .iter()
        .flat_map(|layer| match layer {
            LayerCache::Gdn(c) => {
                let mut t = vec![c.conv.clone().unwrap(), c.state.clone().unwrap()];
                if let Some(ple) = ple(c) {
                    t.push(ple.window.clone());
                    t.push(host(ple.context.iter().map(|&id| id as f32).collect()));
                }
                t
            }
            LayerCache::Attention(c) => {
                let mut t = vec![c.keys().unwrap(), c.values().unwrap()];
                if let Some(ix) = indexer(c) {
                    // Where a fused decode step left them on the device, read back.
                    let mut ix = ix.clone();
                    ix.to_host().unwrap();
                    t.push(host(ix.blocks.concat()));
                    t.push(host(ix.tail.concat()));
                    t.push(host(vec![ix.len as f32]));
                }
                t
            }
        })
        .collect()
}

/// Running a restored cache never changes the snapshot: the same request three times gives
/// the same output, and a second restore equals the first one before it was run.
#[test]
fn restored_caches_never_alias_the_snapshot() {
    for name in reference_plan_checkpoints() {
        let model = load(name);
        let ids = text(&model, 31, 50);
        let boundaries = [40];
        let mut pc = PromptCache::new(BIG);
        let runs: Vec<Run> = (0..3)
            .map(|_| request(&model, &mut pc, &ids, &boundaries, None))
            .collect();
        assert_eq!(runs[0].cached, 0);
        for run in &runs[1..] {
            assert_eq!(run.cached, 40, "{name}");
            assert_same(name, "repeated request", run, &runs[0]);
        }

        let query = text(&model, 31, 45);
        let (n, mut first) = pc.lookup(&query).unwrap().unwrap();
        assert_eq!(n, 40);
        // Every part of the restored state is at the snapshot's position.
        for layer in &first.layers {
            match layer {
                LayerCache::Attention(c) => {
                    assert_eq!(c.len(), n, "{name}");
                    if let Some(ix) = indexer(c) {
                        assert_eq!((ix.len, ix.blocks.len(), ix.tail.len()), (n, n / 4, n % 4));
                    }
                }
                LayerCache::Gdn(c) => {
                    if let Some(ple) = ple(c) {
                        assert_eq!(ple.context, query[n - 2..n], "{name}: n-gram context");
                    }
                }
            }
        }
        let before: Vec<Vec<f32>> = tensors(&first).iter().map(flat).collect();
        model.forward_last(&query[40..], &mut first).unwrap();
        let (_, second) = pc.lookup(&query).unwrap().unwrap();
        let after: Vec<Vec<f32>> = tensors(&second).iter().map(flat).collect();
        assert!(
            before == after,
            "{name}: running a restored cache changed the snapshot"
        );
    }
}

#[test]
fn lookup_leaves_a_token_to_run_and_ignores_other_prefixes() {
    let model = load("qwen3.5-tiny-4bit");
    let ids = text(&model, 41, 20);
    let mut pc = PromptCache::new(BIG);
    request(&model, &mut pc, &ids, &[10], None);
    assert_eq!(pc.snapshot_lengths(), vec![10, 20]);
    // The whole prompt is cached, but its last token must run again for its logits.
    assert_eq!(pc.lookup(&ids).unwrap().unwrap().0, 10);
    let longer: Vec<u32> = [&ids[..], &[1, 2]].concat();
    assert_eq!(pc.lookup(&longer).unwrap().unwrap().0, 20);
    let other = text(&model, 42, 20);
    assert!(pc.lookup(&other).unwrap().is_none());
    assert!(pc.lookup(&ids[..10]).unwrap().is_none());
    assert!(pc.lookup(&[]).unwrap().is_none());
}

/// Least recently used snapshots go first; the budget is never exceeded; a snapshot larger
/// than the whole budget is not kept.
#[test]
fn eviction_is_lru_under_the_byte_budget() {
    let model = load("qwen3-next-tiny-4bit");
    let prompt = |seed| text(&model, seed, 30);
    let snapshot_of = |ids: &[u32]| {
        let mut cache = model.new_cache();
        model.prefill(ids, &mut cache, CHUNK).unwrap();
        cache
    };
    let (a, b, c) = (prompt(51), prompt(52), prompt(53));
    let mut probe = PromptCache::new(BIG);
    probe.insert(&a, &snapshot_of(&a)).unwrap();
    let each = probe.bytes();
    assert!(each > 0);

    let mut pc = PromptCache::new(2 * each + each / 2);
    pc.insert(&a, &snapshot_of(&a)).unwrap();
    pc.insert(&b, &snapshot_of(&b)).unwrap();
    assert_eq!(pc.len(), 2);
    // Touch `a`, so that `b` is the least recently used.
    let longer_a: Vec<u32> = [&a[..], &[7]].concat();
    assert_eq!(pc.lookup(&longer_a).unwrap().unwrap().0, a.len());
    pc.insert(&c, &snapshot_of(&c)).unwrap();
    assert_eq!(pc.len(), 2);
    assert!(pc.bytes() <= pc.budget());
    let with = |ids: &[u32]| [ids, &[7]].concat();
    assert!(pc.lookup(&with(&b)).unwrap().is_none(), "b was evicted");
    assert!(pc.lookup(&with(&a)).unwrap().is_some());
    assert!(pc.lookup(&with(&c)).unwrap().is_some());

    let mut tiny = PromptCache::new(each - 1);
    tiny.insert(&a, &snapshot_of(&a)).unwrap();
    assert_eq!((tiny.len(), tiny.bytes()), (0, 0));
}
