//! The 8-bit-activation kernel on one thread, in the block shapes the model uses:
//!
//! - decode: one activation row against every weight row;
//! - prefill: activation rows in calls of 1, 4 and 8 (`rows_dot` takes a call's rows in
//!   blocks of four, then one at a time);
//!
//! both in the plain layout and in the q8 mode's interleaved one (sixteen rows four bytes at a
//! time, `gdn_ops::ops::affine::q8_interleaved`), with the ratio of the two.
//!
//! Timed in this thread's CPU time (Linux `schedstat`), so other jobs on a shared machine
//! slow it less than the wall clock; the wall clock is printed next to it.
//!
//! `cargo run --release -p gdn-ops --example bench_q8 [-- --rows N --cols N --reps N]`

use gdn_ops::ops::affine::q8::{row_dot, rows_dot, Q8Row};
use gdn_ops::ops::affine::{pack_row, AffineMatrix};
use std::time::Instant;

/// This thread's CPU time in ns, or `None` where `schedstat` is missing.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// `reps` runs of `f` after a warm-up: (mean CPU ms, best wall ms). The CPU time is taken
/// over all runs at once: `schedstat` advances in scheduler ticks on some kernels.
fn time_ms(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut wall = f64::INFINITY;
    let (c0, t_all) = (thread_cpu_ns(), Instant::now());
    for _ in 0..reps {
        let t0 = Instant::now();
        f();
        wall = wall.min(t0.elapsed().as_secs_f64() * 1e3);
    }
    let cpu = match (c0, thread_cpu_ns()) {
        (Some(a), Some(b)) => (b - a) as f64 / 1e6,
        _ => t_all.elapsed().as_secs_f64() * 1e3,
    };
    (cpu / reps as f64, wall)
}

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

fn main() -> anyhow::Result<()> {
    // Default: 16384 × 2048, 16 MiB of packed weights (beyond L2), bf16 scales as stored.
    let rows = arg("--rows").unwrap_or(16384);
    let cols = arg("--cols").unwrap_or(2048);
    let reps = arg("--reps").unwrap_or(100);
    let group = 64;
    let q: Vec<u32> = (0..rows * cols)
        .map(|j| ((j * 2654435761) >> 7) as u32 % 16)
        .collect();
    let groups = rows * cols / group;
    let params = |base: f32| -> Vec<half::bf16> {
        (0..groups)
            .map(|g| half::bf16::from_f32(base + 0.001 * (g % 97) as f32))
            .collect()
    };
    let m = AffineMatrix::new(
        4,
        group,
        [1, rows, cols],
        pack_row(&q, 4),
        params(0.01),
        params(-0.05),
    )?;
    let activation = |a: usize| -> Vec<f32> {
        (0..cols)
            .map(|j| (((j * 37 + a * 101) % 251) as f32 - 125.0) / 60.0)
            .collect()
    };
    println!(
        "q8 kernel, one thread: {rows} x {cols} 4-bit weights ({:.1} MiB packed), {reps} runs each (CPU: mean, wall: best)",
        (rows * cols / 2) as f64 / (1 << 20) as f64
    );
    println!(
        "{:<44} {:>9} {:>9} {:>10}",
        "shape", "cpu ms", "wall ms", "GMAC/s cpu"
    );
    let report = |name: &str, macs: usize, (cpu, wall): (f64, f64)| {
        let rate = macs as f64 / cpu / 1e6;
        println!("{name:<44} {cpu:>9.2} {wall:>9.2} {rate:>10.2}");
    };

    // Decode: one activation row against every weight row.
    let x = activation(0);
    let xq = [Q8Row::quantize(&x)];
    let sums: Vec<f32> = x.chunks(group).map(|c| c.iter().sum()).collect();
    let mut out = vec![0f32; rows];
    let decode = time_ms(reps, || rows_dot(&m, 0, rows, &xq, &sums, &mut out));
    report("decode, one activation row", rows * cols, decode);
    let first = row_dot(&m, 0, &xq[0], &sums);
    assert_eq!(
        first.to_bits(),
        out[0].to_bits(),
        "row_dot and rows_dot disagree"
    );
    // The same rows visited as `streams` interleaved sequential runs (row i of each run in
    // turn): more independent memory streams in flight on one core.
    for streams in [2, 4] {
        let run = rows / streams;
        let t = time_ms(reps, || {
            for i in 0..run {
                for s in 0..streams {
                    let r = s * run + i;
                    out[r] = row_dot(&m, r, &xq[0], &sums);
                }
            }
        });
        report(
            &format!("decode, rows as {streams} interleaved runs"),
            rows * cols,
            t,
        );
    }

    // Prefill: 64 activation rows against the first 1024 weight rows, in calls of `per_call`.
    let (n, prefill_rows) = (64, rows.min(1024));
    let xs: Vec<Vec<f32>> = (0..n).map(activation).collect();
    let xq_n: Vec<Q8Row> = xs.iter().map(|x| Q8Row::quantize(x)).collect();
    let sums_n: Vec<f32> = xs
        .iter()
        .flat_map(|x| x.chunks(group).map(|c| c.iter().sum::<f32>()))
        .collect();
    let gpr = cols / group;
    let prefill = |m: &AffineMatrix, per_call: usize| {
        let mut out = vec![0f32; prefill_rows * per_call];
        time_ms(reps, || {
            for j in (0..n).step_by(per_call) {
                let s = &sums_n[j * gpr..(j + per_call) * gpr];
                rows_dot(m, 0, prefill_rows, &xq_n[j..j + per_call], s, &mut out);
            }
        })
    };
    let mut plain_prefill = vec![];
    for per_call in [1, 4, 8] {
        let t = prefill(&m, per_call);
        plain_prefill.push(t);
        report(
            &format!("prefill, {per_call} activation rows per call"),
            n * prefill_rows * cols,
            t,
        );
    }

    // The same in the interleaved layout (where the CPU level has a SIMD kernel for it).
    let level = gdn_ops::simd::level();
    if !level.has_interleaved_q8_kernel() {
        println!(
            "(level {}: the interleaved layout's portable kernel is not timed)",
            level.name()
        );
        return Ok(());
    }
    let il = m.clone().into_q8_interleaved();
    drop(m);
    let mut il_out = vec![0f32; rows];
    let il_decode = time_ms(reps, || rows_dot(&il, 0, rows, &xq, &sums, &mut il_out));
    report(
        "interleaved: decode, one activation row",
        rows * cols,
        il_decode,
    );
    let worst = out
        .iter()
        .zip(&il_out)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
        .fold(0f32, f32::max);
    let mut il_prefill = vec![];
    for per_call in [1, 4, 8] {
        let t = prefill(&il, per_call);
        il_prefill.push(t);
        report(
            &format!("interleaved: prefill, {per_call} rows per call"),
            n * prefill_rows * cols,
            t,
        );
    }
    println!(
        "speed-up of the interleaved layout (CPU time): decode {:.2}x, prefill (4 per call) {:.2}x; decode outputs differ by at most {worst:.1e} (relative)",
        decode.0 / il_decode.0,
        plain_prefill[1].0 / il_prefill[1].0,
    );
    Ok(())
}
