//! The same tokens through different call patterns give the same logits: prefill then
//! decode equals one long prefill, and any prefill chunking equals a single call.

mod common;
use candle_core::Tensor;
use common::*;

const GATE: f32 = 1e-4;

fn logits_in_chunks(model: &qwen_gdn_model::Model, ids: &[u32], sizes: &mut dyn Iterator<Item = usize>) -> Tensor {
    let mut cache = model.new_cache();
    let mut rows = vec![];
    let mut start = 0;
    while start < ids.len() {
        let n = sizes.next().unwrap().min(ids.len() - start);
        rows.push(model.forward(&ids[start..start + n], &mut cache).unwrap());
        start += n;
    }
    assert_eq!(cache.offset, ids.len());
    Tensor::cat(&rows, 0).unwrap()
}

fn check(name: &str) {
    let (model, r) = (load(name), Reference::load(name));
    let ids = r.ids("tf_ids");
    let whole = logits_in_chunks(&model, &ids, &mut std::iter::repeat(ids.len()));
    // Prefill most of the text, then decode the rest one token at a time.
    let split = ids.len() - 12;
    let mut pattern = std::iter::once(split).chain(std::iter::repeat(1));
    let decoded = logits_in_chunks(&model, &ids, &mut pattern);
    let d = rel_max_diff(&decoded, &whole);
    assert!(d <= GATE, "{name}: prefill+decode differs from one prefill by {d:e}");
    for chunk in [1, 5, 16, 64] {
        let chunked = logits_in_chunks(&model, &ids, &mut std::iter::repeat(chunk));
        let d = rel_max_diff(&chunked, &whole);
        assert!(d <= GATE, "{name}: chunk size {chunk} differs by {d:e}");
    }
}

#[test]
fn qwen3_next() {
    check("qwen3-next-tiny-4bit");
}

#[test]
fn qwen35_dense() {
    check("qwen3.5-tiny-4bit");
}

#[test]
fn qwen35_moe() {
    check("qwen3.5-moe-tiny-4bit");
}
