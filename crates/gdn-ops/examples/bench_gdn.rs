//! Benchmark (not a test): the fused CPU gated-delta op against the same recurrence written
//! with plain candle tensor ops, at Qwen3-Next-80B-A3B GDN shapes, plus the bytes a decode
//! step moves. Run with `scripts/bench-gdn`.

mod timing;

use candle_core::{DType, Device, Tensor, D};
use gdn_ops::gated_delta_update;

const HK: usize = 16;
const HV: usize = 32;
const DK: usize = 128;
const DV: usize = 128;
/// Qwen3-Next-80B-A3B: 48 layers, every fourth full attention.
const GDN_LAYERS: usize = 36;

/// mlx-lm's op-by-op recurrence, one time step at a time.
fn candle_ops(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
) -> candle_core::Result<Tensor> {
    let (b, t, hk, dk) = q.dims4()?;
    let hv = v.dim(2)?;
    let rep = |x: &Tensor| {
        x.unsqueeze(3)?
            .repeat((1, 1, 1, hv / hk, 1))?
            .reshape((b, t, hv, dk))
    };
    let (q, k) = (rep(q)?, rep(k)?);
    let mut ys = vec![];
    for i in 0..t {
        let (qt, kt, vt) = (
            q.narrow(1, i, 1)?.squeeze(1)?,
            k.narrow(1, i, 1)?.squeeze(1)?,
            v.narrow(1, i, 1)?.squeeze(1)?,
        );
        let (gt, bt) = (
            g.narrow(1, i, 1)?.squeeze(1)?,
            beta.narrow(1, i, 1)?.squeeze(1)?,
        );
        *state = state.broadcast_mul(&gt.unsqueeze(D::Minus1)?.unsqueeze(D::Minus1)?)?;
        let kv = state
            .matmul(&kt.unsqueeze(D::Minus1)?)?
            .squeeze(D::Minus1)?;
        let delta = (vt - kv)?.broadcast_mul(&bt.unsqueeze(D::Minus1)?)?;
        *state = (&*state
            + delta
                .unsqueeze(D::Minus1)?
                .broadcast_mul(&kt.unsqueeze(2)?)?)?;
        ys.push(
            state
                .matmul(&qt.unsqueeze(D::Minus1)?)?
                .squeeze(D::Minus1)?,
        );
    }
    Tensor::stack(&ys, 1)
}

fn median_ms(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    timing::sorted_ms(&mut f, reps)[reps / 2]
}

fn main() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    println!("GDN recurrence on the CPU, Qwen3-Next-80B shapes (Hk {HK}, Hv {HV}, Dk {DK}, Dv {DV}), B = 1");
    println!(
        "{:>6} {:>14} {:>14} {:>8}",
        "T", "fused ms", "candle-ops ms", "ratio"
    );
    for t in [1usize, 16, 128] {
        let q = (Tensor::randn(0f32, 1., (1, t, HK, DK), &dev)? / (DK as f64).sqrt())?;
        let k = (Tensor::randn(0f32, 1., (1, t, HK, DK), &dev)? / (DK as f64).sqrt())?;
        let v = Tensor::randn(0f32, 1., (1, t, HV, DV), &dev)?;
        let g = Tensor::rand(0.9f32, 1., (1, t, HV), &dev)?;
        let beta = Tensor::rand(0f32, 1., (1, t, HV), &dev)?;
        let state = Tensor::zeros((1, HV, DV, DK), DType::F32, &dev)?;
        let reps = if t == 1 { 50 } else { 5 };
        let fused = median_ms(
            || drop(gated_delta_update(&q, &k, &v, &g, &beta, &state).unwrap()),
            reps,
        );
        let mut st = state.clone();
        let ops = median_ms(
            || drop(candle_ops(&q, &k, &v, &g, &beta, &mut st).unwrap()),
            reps,
        );
        println!("{t:>6} {fused:>14.3} {ops:>14.3} {:>7.1}x", ops / fused);
    }
    println!();
    println!("Bytes per decoded token (state read once + written once per GDN layer, {GDN_LAYERS} layers):");
    for (name, bytes) in [("f32", 4usize), ("bf16", 2)] {
        let per_layer = 2 * HV * DV * DK * bytes;
        let qkv = (2 * HK * DK + HV * DV) * 2 + HV * DV * 2; // bf16 q, k, v in and y out
        println!(
            "  state {name:>4}: {:>6.2} MiB per layer, {:>7.1} MB per token (+{:.2} MB q/k/v/y)",
            per_layer as f64 / (1 << 20) as f64,
            (per_layer * GDN_LAYERS) as f64 / 1e6,
            (qkv * GDN_LAYERS) as f64 / 1e6
        );
    }
    Ok(())
}
