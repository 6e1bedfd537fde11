//! Prints what one decoded token costs on the device plan (the Metal path) for a config:
//! kernel launches, counted per layer kind on a tiny checkpoint with the same layer structure
//! (the count does not depend on widths), and bytes from config.json.
//!
//! cargo run --release -p qwen-gdn-model --example decode_budget -- \
//!     tests/data/configs/qwen3-next-80b-a3b-instruct-4bit.json models/qwen3-next-tiny-4bit

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use gdn_ops::launches;
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::footprint::DecodeFootprint;
use qwen_gdn_model::{Config, LoadOptions, Model, Plan, StateDtype};
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, tiny] = &args[..] else {
        anyhow::bail!(
            "usage: decode_budget <config.json> <tiny checkpoint with the same layer kinds>"
        )
    };
    let text = std::fs::read_to_string(config).with_context(|| config.clone())?;
    let cfg = Config::from_json_str(&text, config)?;
    let opts = LoadOptions {
        dtype: DType::BF16,
        plan: Some(Plan::Device),
        ..LoadOptions::default()
    };
    let model = Model::load(&PathBuf::from(tiny), &Device::Cpu, &opts)?;

    // One decode step after a short prefill, measured part by part.
    let mut cache = model.new_cache();
    model.prefill(&[1, 2, 3, 4, 5], &mut cache, 16)?;
    launches::take();
    model.forward_last(&[6], &mut cache)?;
    let total_tiny = launches::take();
    let embed = {
        model.embed(&[6])?;
        launches::take()
    };
    // Per layer kind: (mixer with its norm, feed-forward with its norm, residual adds).
    let mut per_kind: [Option<(usize, usize)>; 2] = [None, None];
    let mut h = model.embed(&[7])?;
    launches::take();
    let mut layers_tiny = 0;
    for (i, (layer, c)) in model
        .layers()
        .iter()
        .zip(cache.layers.iter_mut())
        .enumerate()
    {
        let mixed = (&h + layer.mixer_forward(&h, c, cache.offset)?)?;
        let mixer = launches::take();
        h = (&mixed + layer.feed_forward(&mixed)?)?;
        let ffn = launches::take();
        // The two residual adds (the layer's own forward records them).
        layers_tiny += mixer + ffn + 2;
        let kind = model.config().layer_kind(i) as usize;
        per_kind[kind].get_or_insert((mixer, ffn));
    }
    let head = total_tiny - embed - layers_tiny;
    let ((gdn_mixer, gdn_ffn), (attn_mixer, attn_ffn)) = (
        per_kind[LayerKind::LinearAttention as usize].context("no GDN layer in the tiny model")?,
        per_kind[LayerKind::FullAttention as usize]
            .context("no attention layer in the tiny model")?,
    );
    let (gdn, attn) = (gdn_mixer + gdn_ffn + 2, attn_mixer + attn_ffn + 2);
    let n_attn = (0..cfg.num_hidden_layers)
        .filter(|&i| cfg.layer_kind(i) == LayerKind::FullAttention)
        .count();
    let n_gdn = cfg.num_hidden_layers - n_attn;
    let total = embed + n_gdn * gdn + n_attn * attn + head;
    println!("kernel launches per decoded token (device plan, bf16):");
    println!("  embedding {embed}, final norm + head {head}");
    println!(
        "  GDN layer {gdn} = norm + GDN {gdn_mixer} + norm + MLP/MoE {gdn_ffn} + 2 residual adds"
    );
    println!("  attention layer {attn} = norm + attention {attn_mixer} + norm + MLP/MoE {attn_ffn} + 2 residual adds");
    println!("  {config}: {embed} + {n_gdn}×{gdn} + {n_attn}×{attn} + {head} = {total}");
    println!();
    println!("bytes per decoded token ({config}):");
    let gb = |b: usize| b as f64 / 1e9;
    for (context, state) in [
        (0, StateDtype::F32),
        (4096, StateDtype::F32),
        (32768, StateDtype::F32),
        (4096, StateDtype::Bf16),
    ] {
        let f = DecodeFootprint::of(&cfg, context, state);
        println!(
            "  context {context:>6}, {state:?} state: weights {:.3} GB + GDN state {:.3} GB + KV {:.3} GB = {:.3} GB; roofline {:.0} / {:.0} / {:.0} tok/s at 400 / 546 / 800 GB/s",
            gb(f.active_weights),
            gb(f.gdn_state),
            gb(f.kv_cache),
            gb(f.total()),
            400.0 / gb(f.total()),
            546.0 / gb(f.total()),
            800.0 / gb(f.total()),
        );
    }
    let f = DecodeFootprint::of(&cfg, 0, StateDtype::F32);
    println!("  checkpoint weights: {:.2} GB", gb(f.all_weights));
    Ok(())
}
