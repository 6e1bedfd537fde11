//! Prints what one decoded token costs on the device plan (the Metal path) for a config:
//! kernel launches, counted per layer kind on a tiny checkpoint with the same layer structure
//! (the count does not depend on widths), and bytes from config.json. `--composed` counts
//! the composed ops the fused kernels replace.
//!
//! cargo run --release -p qwen-gdn-model --example decode_budget -- \
//!     tests/data/configs/qwen3-next-80b-a3b-instruct-4bit.json models/qwen3-next-tiny-4bit
//! cargo run --release -p qwen-gdn-model --example decode_budget -- \
//!     tests/data/configs/qwen3.8-flash-next-release-4bit.json models/qwen4-exp-tiny-4bit

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use qwen_gdn_model::footprint::DecodeFootprint;
use qwen_gdn_model::model::LaunchBudget;
use qwen_gdn_model::{Config, Model, Plan, RunOptions, StateDtype};
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let composed = args.iter().any(|a| a == "--composed");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--composed").collect();
    let [config, tiny] = &args[..] else {
        anyhow::bail!(
            "usage: decode_budget [--composed] <config.json> <tiny checkpoint with the same layer kinds>"
        )
    };
    let text = std::fs::read_to_string(config).with_context(|| config.to_string())?;
    let cfg = Config::from_json_str(&text, config)?;
    let opts = RunOptions {
        dtype: DType::BF16,
        plan: Some(Plan::Device),
        ..RunOptions::default()
    };
    let mut model = Model::load(&PathBuf::from(tiny), &Device::Cpu, &opts)?;
    model.set_fused_decode(!composed);

    let budget = LaunchBudget::measure(&model)?;
    let (outside, gdn, attn) = (budget.outside, budget.gdn_layer, budget.attention_layer);
    let (n_gdn, n_attn) = LaunchBudget::layers_of(&cfg);
    let n_ple = qwen_gdn_model::model::ple_layers(&cfg).len();
    let total = budget.total_for(&cfg);
    let fused = if model.fused_decode() {
        "fused"
    } else {
        "composed"
    };
    println!("kernel launches per decoded token (device plan, bf16, {fused} decode):");
    println!("  outside the layers (embedding, first norm or final stream mixer, head) {outside}");
    println!("  GDN layer {gdn}, attention layer {attn} (each with its feed-forward, residual adds and norms)");
    if budget.ple > 0 {
        println!("  per-layer embedding block {} (qwen4_exp)", budget.ple);
        println!(
            "  {config}: {outside} + {n_gdn}×{gdn} + {n_attn}×{attn} + {n_ple}×{} = {total}",
            budget.ple
        );
    } else {
        println!("  {config}: {outside} + {n_gdn}×{gdn} + {n_attn}×{attn} = {total}");
    }
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
    if f.ngram_tables > 0 {
        println!(
            "  n-gram tables (mapped, rows gathered; not in memory): {:.2} GB",
            gb(f.ngram_tables)
        );
    }
    println!();
    // Host syncs per token: the logits' readback, and for qwen4_exp's composed step one more
    // per QSA layer (its indexer's projection is read back for the selection on the host;
    // the fused step selects on the device).
    let syncs = 1 + if cfg.qwen4_exp.is_some() && !model.fused_decode() {
        n_attn
    } else {
        0
    };
    metal_estimate(
        total,
        syncs,
        &DecodeFootprint::of(&cfg, 4096, StateDtype::F32),
    );
    Ok(())
}

/// A paper estimate of decode on Apple GPUs: the bytes at a fraction of the memory bandwidth,
/// plus a GPU cost per dependent dispatch, per command-buffer boundary and per host sync.
/// The constants are assumptions, stated in docs/metal.md with their sources.
fn metal_estimate(launches: usize, syncs: usize, footprint: &DecodeFootprint) {
    /// GPU time a dependent dispatch adds (measured on an M2 Pro by injecting inert
    /// dispatches: ferrox issue #149).
    const DISPATCH_US: f64 = 5.16;
    /// One command-buffer boundary.
    const COMMAND_BUFFER_US: f64 = 20.0;
    // Command buffers per token: up to `gdn_ops::backend::metal::COMPUTE_PER_BUFFER` (1000)
    // launches go into one, committed at the readback of the logits (and at every other
    // host sync).
    let command_buffers = launches.div_ceil(1000).max(syncs);
    let bytes = footprint.total() as f64;
    println!(
        "paper estimate of decode on Apple GPUs at context 4096 ({launches} dispatches, {command_buffers} command buffer(s), {syncs} host sync(s), {:.3} GB per token):",
        bytes / 1e9
    );
    println!("  chip        GB/s   tok/s (75% of bandwidth, 0.3 ms per sync)   tok/s (60%, 1 ms per sync)");
    for (chip, bandwidth) in [("M3 Max", 400.0), ("M4 Max", 546.0), ("M3 Ultra", 819.0)] {
        let rate = |efficiency: f64, sync_ms: f64| {
            let ms = bytes / (efficiency * bandwidth * 1e9) * 1e3
                + launches as f64 * DISPATCH_US / 1e3
                + command_buffers as f64 * COMMAND_BUFFER_US / 1e3
                + syncs as f64 * sync_ms;
            1e3 / ms
        };
        println!(
            "  {chip:<10} {bandwidth:>5.0}   {:>6.1}                                   {:>6.1}",
            rate(0.75, 0.3),
            rate(0.6, 1.0)
        );
    }
}
