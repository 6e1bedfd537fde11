//! What the cache holds after a prefill is its own storage, sized to what it caches: a view
//! into a prefill temporary would keep that temporary alive for the whole generation.

mod common;
use candle_core::{Storage, Tensor};
use common::*;
use qwen_gdn_model::cache::LayerCache;

/// Elements in the storage behind `t` (not in `t`'s view of it).
fn storage_elems(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => s.as_slice::<f32>().expect("f32 cache").len(),
        _ => unreachable!("the test model is on the CPU"),
    }
}

#[test]
fn conv_cache_does_not_pin_the_prefill_buffer() {
    let model = load("qwen3-next-tiny-4bit");
    let cfg = model.config();
    let (kernel, conv_dim) = (cfg.linear_conv_kernel_dim, cfg.conv_dim());
    let mut cache = model.new_cache();
    let ids: Vec<u32> = (0..64).collect();
    model.prefill(&ids, &mut cache, 64).unwrap();
    let mut seen = 0;
    for layer in &cache.layers {
        if let LayerCache::Gdn(c) = layer {
            let conv = c.conv.as_ref().unwrap();
            assert_eq!(conv.dims(), [1, kernel - 1, conv_dim]);
            // Without the copy this is (64 + K − 1)·conv_dim: the padded prefill input.
            assert_eq!(storage_elems(conv), (kernel - 1) * conv_dim);
            seen += 1;
        }
    }
    assert_eq!(seen, 4, "GDN layers in the fixture");
}
