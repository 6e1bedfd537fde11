//! The same tokens through different call patterns give the same logits: prefill then
//! decode equals one long prefill, and any prefill chunking equals a single call.

mod common;
use candle_core::Tensor;
use common::*;

const GATE: f32 = 1e-4;

fn logits_in_chunks(
    model: &qwen_gdn_model::Model,
    ids: &[u32],
    sizes: &mut dyn Iterator<Item = usize>,
) -> Tensor {
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
    assert!(
        d <= GATE,
        "{name}: prefill+decode differs from one prefill by {d:e}"
    );
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

/// A cache made with an fp32 state and resumed with bf16 states (and the other way round)
/// is converted on first use, not rejected.
#[test]
fn cache_resumes_across_state_dtypes() {
    use candle_core::DType;
    use qwen_gdn_model::cache::LayerCache;
    use qwen_gdn_model::StateDtype;
    let model = load("qwen3.5-tiny-4bit");
    let ids = Reference::load("qwen3.5-tiny-4bit").ids("tf_ids");
    let state_dtypes = |c: &qwen_gdn_model::Cache| -> Vec<DType> {
        c.layers
            .iter()
            .filter_map(|l| match l {
                LayerCache::Gdn(g) => g.state.as_ref().map(|s| s.dtype()),
                LayerCache::Attention(_) => None,
            })
            .collect()
    };
    let reference = model.forward(&ids, &mut model.new_cache()).unwrap();
    for (first, second, want) in [
        (StateDtype::F32, StateDtype::Bf16, DType::BF16),
        (StateDtype::Bf16, StateDtype::F32, DType::F32),
    ] {
        let mut cache = model.new_cache_with(first);
        model.forward(&ids[..50], &mut cache).unwrap();
        cache.set_gdn_state_dtype(second);
        let tail = model.forward(&ids[50..], &mut cache).unwrap();
        assert!(
            state_dtypes(&cache).iter().all(|&d| d == want),
            "{:?}",
            state_dtypes(&cache)
        );
        let d = rel_max_diff(&tail, &reference.narrow(0, 50, ids.len() - 50).unwrap());
        // One bf16 rounding of the state: close to, but not exactly, the fp32 run.
        assert!(d > 0.0 && d < 2e-2, "resumed logits differ by {d:e}");
    }
}
