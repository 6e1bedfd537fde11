//! Benchmark (not a test): one GDN layer's prefill on the CPU, the token-by-token recurrence
//! against the chunked (WY) form, at Qwen3-Next-80B-A3B shapes. Run with
//! `scripts/bench-gdn-prefill`; `--steps 512,4096`, `--reps N`, `--only chunked` (or
//! `recurrent`) and `--g-min X` (decays uniform in [X, 1), default 0.9) change what it runs.

mod timing;

use candle_core::{DType, Device, Tensor};
use gdn_ops::{gated_delta_update_in, GdnForm};

const HK: usize = 16;
const HV: usize = 32;
const DK: usize = 128;
const DV: usize = 128;

/// CPU time of all of this process's threads in ns (Linux `schedstat`), or `None`: on a
/// machine shared with other jobs it moves less than the wall clock.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// (median wall ms, mean CPU ms) of `reps` calls after a warm-up call.
fn time_ms(mut f: impl FnMut(), reps: usize) -> (f64, f64) {
    f();
    let cpu0 = cpu_ns();
    let times = timing::sorted_ms(&mut f, reps);
    let cpu = match (cpu0, cpu_ns()) {
        (Some(a), Some(b)) => (b - a) as f64 / 1e6 / reps as f64,
        _ => f64::NAN,
    };
    (times[reps / 2], cpu)
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    let steps: Vec<usize> = arg("--steps")
        .unwrap_or_else(|| "64,512,4096".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let reps: usize = arg("--reps").map_or(Ok(5), |s| s.parse())?;
    // The decays are uniform in [g_lo, 1): the default keeps every chunk's products of decays
    // in the normal f32 range; a low bound sends some of them down to subnormals.
    let g_lo: f32 = arg("--g-min").map_or(Ok(0.9), |s| s.parse())?;
    let dev = Device::Cpu;
    println!(
        "GDN prefill, one layer on the CPU: Qwen3-Next-80B shapes (Hk {HK}, Hv {HV}, Dk {DK}, Dv {DV}), B = 1, \
         f32 state, {} threads, median of {reps}",
        rayon::current_num_threads()
    );
    println!("wall: median ms per call; cpu: mean CPU ms per call over all threads");
    println!(
        "{:>6} {:>15} {:>15} {:>13} {:>13} {:>10} {:>9} {:>14}",
        "T",
        "recurrent wall",
        "recurrent cpu",
        "chunked wall",
        "chunked cpu",
        "ratio wall",
        "ratio cpu",
        "chunked tok/s"
    );
    for t in steps {
        let unit = |scale: f64| -> anyhow::Result<Tensor> {
            let x = Tensor::randn(0f32, 1., (1, t, HK, DK), &dev)?;
            let norm = x.sqr()?.sum_keepdim(3)?.sqrt()?;
            Ok((x.broadcast_div(&norm)? * scale)?)
        };
        let q = unit(1.0 / (DK as f64).sqrt())?;
        let k = unit(1.0)?;
        let v = Tensor::randn(0f32, 1., (1, t, HV, DV), &dev)?;
        let g = Tensor::rand(g_lo, 1., (1, t, HV), &dev)?;
        let beta = Tensor::rand(0f32, 1., (1, t, HV), &dev)?;
        let state = Tensor::zeros((1, HV, DV, DK), DType::F32, &dev)?;
        let time = |form| {
            time_ms(
                || {
                    drop(
                        gated_delta_update_in(form, &q, &k, &v, &g, &beta, &state, None)
                            .expect("gated delta"),
                    )
                },
                reps,
            )
        };
        let only = arg("--only");
        let skip = |name: &str| only.as_deref().is_some_and(|o| o != name);
        let nan = (f64::NAN, f64::NAN);
        let (rw, rc) = if skip("recurrent") {
            nan
        } else {
            time(GdnForm::Recurrent)
        };
        let (cw, cc) = if skip("chunked") {
            nan
        } else {
            time(GdnForm::Chunked)
        };
        println!(
            "{t:>6} {rw:>15.2} {rc:>15.2} {cw:>13.2} {cc:>13.2} {:>9.2}x {:>8.2}x {:>14.0}",
            rw / cw,
            rc / cc,
            t as f64 / cw * 1e3
        );
    }
    Ok(())
}
