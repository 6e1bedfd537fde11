//! The fused GDN conv front (one `gdn_conv_prep` launch per layer call, `layers/gdn/
//! conv_front.rs`) against the composed ops it replaces, through the whole device-plan model
//! on every GDN fixture whose dims the kernels cover. `RunOptions::conv_front`
//! (`QWEN_GDN_CONV_FRONT`) picks the path at load: on the CPU `fused` runs the kernels' CPU twin (the CPU default is composed), on CUDA
//! (`QWEN_GDN_TEST_DEVICE=cuda`) the kernel.
//!
//! Per fixture, f32: the fused prompt logits within 1e-4 of the composed ones (relative to
//! max |logit|) and within 1e-3 of mlx-lm's; prefill in chunks of 1, 3 (< K), 4 (= K), 5 and
//! 64 tokens, and prefill then decode, within 1e-4 of one whole prefill (the conv state carried
//! across chunks); and fewer launches than the composed front.

mod common;
use candle_core::{DType, Tensor};
use common::*;
use qwen_gdn_model::layers::gdn::ConvFront;
use qwen_gdn_model::{Model, Plan, RunOptions};

const GATE: f32 = 1e-4;

fn load_front(name: &str, front: ConvFront) -> Model {
    let opts = RunOptions {
        dtype: DType::F32,
        plan: Some(Plan::Device),
        conv_front: Some(front),
        ..common::run_options()
    };
    load_on(name, &opts, &device_under_test())
}

/// Logits of `ids` fed in chunks of `sizes`, and the launches they took.
fn in_chunks(
    model: &Model,
    ids: &[u32],
    sizes: &mut dyn Iterator<Item = usize>,
) -> (Tensor, usize) {
    let mut cache = model.new_cache();
    let mut rows = vec![];
    let mut start = 0;
    let before = gdn_ops::launches::count();
    while start < ids.len() {
        let n = sizes.next().unwrap().min(ids.len() - start);
        rows.push(model.forward(&ids[start..start + n], &mut cache).unwrap());
        start += n;
    }
    let launches = gdn_ops::launches::count() - before;
    (Tensor::cat(&rows, 0).unwrap(), launches)
}

fn check(name: &str) {
    let composed = load_front(name, ConvFront::Composed);
    let fused = load_front(name, ConvFront::Fused);
    let reference = Reference::load(name);
    let ids = reference.ids("tf_ids");
    let whole = |m: &Model| in_chunks(m, &ids, &mut std::iter::repeat(ids.len()));
    let (want, composed_launches) = whole(&composed);
    let (got, fused_launches) = whole(&fused);
    let d = rel_max_diff(&got, &want);
    eprintln!(
        "{name}: fused vs composed conv front, f32 prompt: {d:e}; launches {fused_launches} vs {composed_launches}"
    );
    assert!(
        d <= GATE,
        "{name}: fused front differs from composed by {d:e}"
    );
    assert!(
        fused_launches < composed_launches,
        "{name}: the fused front did not run ({fused_launches} launches, composed {composed_launches})"
    );
    let mlx = reference.get("tf_logits");
    let d = rel_max_diff(&got, mlx);
    assert!(
        d <= 1e-3,
        "{name}: fused front differs from mlx-lm by {d:e}"
    );
    assert_eq!(argmax_rows(&got), argmax_rows(mlx), "{name}: argmax");
    for chunk in [1, 3, 4, 5, 64] {
        let (chunked, _) = in_chunks(&fused, &ids, &mut std::iter::repeat(chunk));
        let d = rel_max_diff(&chunked, &got);
        assert!(
            d <= GATE,
            "{name}: fused, chunks of {chunk} differ by {d:e}"
        );
    }
    let split = ids.len() - 12;
    let mut pattern = std::iter::once(split).chain(std::iter::repeat(1));
    let (decoded, _) = in_chunks(&fused, &ids, &mut pattern);
    let d = rel_max_diff(&decoded, &got);
    assert!(d <= GATE, "{name}: fused prefill + decode differs by {d:e}");
}

#[test]
fn fused_conv_front_matches_the_composed_ops_on_every_covered_fixture() {
    // Key and value head dims 32 (the kernels' smallest); the qwen4-exp fixtures' 16 are
    // not covered and keep the composed front.
    for name in [
        "qwen3-next-tiny-4bit",
        "qwen3.5-tiny-4bit",
        "qwen3.5-moe-tiny-4bit",
    ] {
        check(name);
    }
}
