//! Prints the kernel launches, host uploads (address tables, positions) and read-backs (in the
//! layers) of one batched decode step (`Model::decode_batch`) for a config
//! at several batch sizes, composed (fused decode off: the step before issue 29's fused
//! batch) and fused, counted per layer kind on a tiny checkpoint with the same layer kinds
//! (the count does not depend on widths) and scaled to the config's layers.
//!
//! cargo run -p qwen-gdn-model --example batch_budget -- \
//!     tests/data/configs/qwen3-next-80b-a3b-instruct-4bit.json models/qwen3-next-tiny-4bit 1,16,64

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::model::LaunchBudget;
use qwen_gdn_model::{Config, Model, Plan, RunOptions};
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, tiny, batches] = &args[..] else {
        anyhow::bail!(
            "usage: batch_budget <config.json> <tiny checkpoint with the same layer kinds> <B,B,...>"
        )
    };
    let text = std::fs::read_to_string(config).with_context(|| config.to_string())?;
    let cfg = Config::from_json_str(&text, config)?;
    let batches = batches
        .split(',')
        .map(|b| {
            b.trim()
                .parse::<usize>()
                .with_context(|| format!("batch size {b:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let opts = RunOptions {
        dtype: DType::BF16,
        plan: Some(Plan::Device),
        ..RunOptions::default()
    };
    let mut model = Model::load(&PathBuf::from(tiny), &Device::Cpu, &opts)?;
    let (n_gdn, n_attn) = LaunchBudget::layers_of(&cfg);
    println!("kernel launches per batched decode step of {config} ({n_gdn} GDN + {n_attn} attention layers), device plan, bf16:");
    println!(
        "{:>5} {:>10} {:>10} {:>12} {:>10} {:>8} {:>10}",
        "B", "path", "per GDN", "per attention", "step", "uploads", "read-backs"
    );
    for &b in &batches {
        for fused in [false, true] {
            model.set_fused_decode(fused);
            let mut caches: Vec<_> = (0..b)
                .map(|i| {
                    let mut c = model.new_cache();
                    model.prefill(&[1, 2, 3, (4 + i % 5) as u32], &mut c, 16)?;
                    Ok(c)
                })
                .collect::<Result<_>>()?;
            let mut refs: Vec<_> = caches.iter_mut().collect();
            let tokens = vec![6u32; b];
            // A first step allocates states; the second is the steady one.
            model.decode_batch(&tokens, &mut refs)?;
            gdn_ops::launches::take();
            let uploads_before = gdn_ops::launches::uploads();
            let (_, counter) = model.decode_batch_counted(&tokens, &mut refs)?;
            let per_layer = &counter.per_layer;
            let outside = gdn_ops::launches::take() - per_layer.iter().sum::<usize>();
            // Host-to-device copies of the step (address tables, positions), scaled as the
            // launches are.
            let uploads_outside = gdn_ops::launches::uploads()
                - uploads_before
                - counter.uploads_per_layer.iter().sum::<usize>();
            let first_of = |kind: LayerKind, counts: &[usize]| {
                (0..counts.len())
                    .find(|&i| model.config().layer_kind(i) == kind)
                    .map(|i| counts[i])
                    .context("a layer kind the tiny checkpoint lacks")
            };
            let (gdn, attn) = (
                first_of(LayerKind::LinearAttention, per_layer)?,
                first_of(LayerKind::FullAttention, per_layer)?,
            );
            let uploads = uploads_outside
                + n_gdn * first_of(LayerKind::LinearAttention, &counter.uploads_per_layer)?
                + n_attn * first_of(LayerKind::FullAttention, &counter.uploads_per_layer)?;
            let step = outside + n_gdn * gdn + n_attn * attn;
            let read_backs = n_gdn
                * first_of(LayerKind::LinearAttention, &counter.read_backs_per_layer)?
                + n_attn * first_of(LayerKind::FullAttention, &counter.read_backs_per_layer)?;
            let path = if fused { "fused" } else { "composed" };
            println!(
                "{b:>5} {path:>10} {gdn:>10} {attn:>12} {step:>10} {uploads:>8} {read_backs:>10}"
            );
        }
    }
    Ok(())
}
