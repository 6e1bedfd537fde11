//! Prefill in chunks leaves the cache a whole-sequence forward leaves. The KV buffers grow by
//! `KV_STEP` (256) positions, so most chunk sizes make a chunk cross the first growth boundary
//! with the buffer partly filled — where growing once failed on every backend ("slice-set only
//! supports contiguous tensors").

mod common;
use candle_core::{DType, Device, Tensor};
use common::*;
use qwen_gdn_model::cache::{Cache, KvCache, LayerCache};
use qwen_gdn_model::Model;

const TOKENS: usize = 300;
const GATE: f32 = 1e-4;

/// `[1, heads, positions, dim]` of distinct values.
fn positions(heads: usize, n: usize, dim: usize, seed: f32) -> Tensor {
    let v: Vec<f32> = (0..heads * n * dim).map(|i| i as f32 + seed).collect();
    Tensor::from_vec(v, (1, heads, n, dim), &Device::Cpu).unwrap()
}

/// Every chunk size from 1 to 300, straight on the cache: what it returns and holds after each
/// append is exactly the keys and values appended so far.
#[test]
fn kv_cache_takes_every_chunk_size() {
    let (heads, dim) = (2, 4);
    let keys = positions(heads, TOKENS, dim, 0.0);
    let values = positions(heads, TOKENS, dim, 0.5);
    for chunk in 1..=TOKENS {
        let mut cache = KvCache::default();
        let mut start = 0;
        while start < TOKENS {
            let n = chunk.min(TOKENS - start);
            let (k, v) = cache
                .append(
                    &keys.narrow(2, start, n).unwrap(),
                    &values.narrow(2, start, n).unwrap(),
                )
                .unwrap_or_else(|e| panic!("chunk size {chunk}, at {start}: {e}"));
            start += n;
            assert_eq!(cache.len(), start);
            assert_eq!(
                flat(&k),
                flat(&keys.narrow(2, 0, start).unwrap()),
                "chunk size {chunk}"
            );
            assert_eq!(
                flat(&v),
                flat(&values.narrow(2, 0, start).unwrap()),
                "chunk size {chunk}"
            );
        }
        assert_eq!(cache.capacity(), 512, "chunk size {chunk}");
    }
}

/// Every cached tensor of `cache`, in layer order (KV views trimmed to the cached length).
fn cached_tensors(cache: &Cache) -> Vec<Tensor> {
    cache
        .layers
        .iter()
        .flat_map(|layer| match layer {
            LayerCache::Gdn(c) => vec![c.conv.clone().unwrap(), c.state.clone().unwrap()],
            LayerCache::Attention(c) => vec![c.keys().unwrap(), c.values().unwrap()],
        })
        .collect()
}

/// Prefills all but the last chunk, runs the last one for its final logits.
fn run_in_chunks(model: &Model, ids: &[u32], chunk: usize) -> (Tensor, Cache) {
    let mut cache = model.new_cache();
    let last_start = (ids.len() - 1) / chunk * chunk;
    model
        .prefill(&ids[..last_start], &mut cache, chunk)
        .unwrap();
    let logits = model.forward_last(&ids[last_start..], &mut cache).unwrap();
    (logits, cache)
}

/// The model end to end, at chunk sizes around the growth boundary (the reproduction
/// is a ~300-token prompt with `--prefill-chunk-size 100`): the next-token logits and every
/// layer's cache equal those of one forward over the whole text.
#[test]
fn model_prefill_in_chunks_matches_one_forward() {
    let model = load("qwen3-next-tiny-4bit");
    let vocab = model.config().vocab_size as u64;
    // A fixed pseudo-random text (an LCG).
    let mut x = 12345u64;
    let ids: Vec<u32> = (0..TOKENS)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab) as u32
        })
        .collect();
    let mut whole_cache = model.new_cache();
    let whole = model.forward_last(&ids, &mut whole_cache).unwrap();
    let want = cached_tensors(&whole_cache);
    for chunk in [7, 100, 255, 256, 257, 299] {
        let (logits, cache) = run_in_chunks(&model, &ids, chunk);
        assert_eq!(cache.offset, TOKENS);
        let d = rel_max_diff(&logits, &whole);
        assert!(d <= GATE, "chunk size {chunk}: logits differ by {d:e}");
        for (i, (got, want)) in cached_tensors(&cache).iter().zip(&want).enumerate() {
            assert_eq!(got.dtype(), DType::F32);
            let d = rel_max_diff(got, want);
            assert!(
                d <= GATE,
                "chunk size {chunk}: cached tensor {i} differs by {d:e}"
            );
        }
    }
}
