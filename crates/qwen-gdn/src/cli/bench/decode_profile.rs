//! `bench --profile-decode`: every kernel of one fused decode step (one token, B = 1) at the
//! benchmark's depth, each timed on its own with the device drained around it
//! (`gdn_ops::profile`), with the bytes it moves counted from its arguments, its achieved
//! bandwidth against the device's measured copy bandwidth, and its grid.
//!
//! The profiled step runs eagerly (`Model::decode_step_with_launches`), never replayed from a
//! CUDA graph: replay would hide the launches. Its rows add up to less than a step: candle's
//! own ops (the logits' cast) are counted but not timed, and an eager step also waits for the
//! host between launches. So the rows are set against the wall time of unprofiled eager steps
//! (drained before and after), and the difference is shown as the remainder.

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use gdn_ops::profile::{self, CopyBandwidth, KernelRow, LayerKind, Recording};
use qwen_gdn_model::{Cache, Model};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Unprofiled eager steps whose median is the step's wall time.
const WALL_STEPS: usize = 5;

/// What is profiled: one decode step, one verify pass of speculative decoding, or one
/// batched decode step.
#[derive(Clone, Copy)]
pub(crate) enum Profiled {
    DecodeStep,
    /// A verify pass of this many tokens (the step's token and its drafts), closed on one
    /// kept token, as `--verify-cost` times it.
    VerifyPass(usize),
    /// A batched decode step of this many sequences (`Model::decode_batch`), each at depth
    /// -p of its own prompt, as `--batch` times it.
    BatchStep(usize),
}

impl Profiled {
    fn describe(self) -> String {
        match self {
            Self::DecodeStep => "one fused decode step".into(),
            Self::VerifyPass(t) => format!("one fused verify pass of {t} tokens (closed on one)"),
            Self::BatchStep(b) => format!("one fused batched decode step of {b} sequences"),
        }
    }

    /// The sequences one run steps (B of a batched step; 1 otherwise).
    fn sequences(self) -> usize {
        match self {
            Self::BatchStep(b) => b,
            Self::DecodeStep | Self::VerifyPass(_) => 1,
        }
    }
}

/// What a profiled run steps: each sequence's cache, the ids it has seen, and its next token.
struct Subject {
    what: Profiled,
    caches: Vec<Cache>,
    seen: Vec<Vec<u32>>,
    tokens: Vec<u32>,
}

impl Subject {
    /// Prefills `what`'s sequences as a bench repetition does: the prompt itself for one,
    /// and for a batch of B the prompt rotated by the sequence's index, so that the rows route
    /// to experts of their own (as the distinct prompts of `--batch` do).
    fn prefill(model: &Model, prompt: &[u32], chunk: usize, what: Profiled) -> Result<Self> {
        let (mut caches, mut seen, mut tokens) = (vec![], vec![], vec![]);
        for i in 0..what.sequences() {
            let mut ids = prompt.to_vec();
            ids.rotate_left(i % prompt.len().max(1));
            let mut cache = model.new_cache();
            let chunks: Vec<&[u32]> = ids.chunks(chunk).collect();
            let (last, head) = chunks.split_last().context("empty prompt")?;
            for part in head {
                model.prefill(part, &mut cache, chunk)?;
            }
            let logits = model.forward_last(last, &mut cache)?;
            tokens.push(super::common::greedy(model, &logits, &ids, chunk)?);
            caches.push(cache);
            seen.push(ids);
        }
        Ok(Self {
            what,
            caches,
            seen,
            tokens,
        })
    }

    /// Runs the profiled thing once at the caches' ends, eagerly (a verify pass's first token
    /// is the next one, its drafts the last ids seen: only their cost is measured). A decode
    /// step returns its logits, to pick the next tokens from after the clock stops.
    fn run(&mut self, model: &Model) -> Result<Option<Tensor>> {
        for (seen, &token) in self.seen.iter_mut().zip(&self.tokens) {
            seen.push(token);
        }
        match self.what {
            Profiled::DecodeStep => Ok(Some(
                model
                    .decode_step_with_launches(self.tokens[0], &mut self.caches[0])?
                    .0,
            )),
            Profiled::VerifyPass(t) => {
                let tokens: Vec<u32> = std::iter::once(self.tokens[0])
                    .chain(self.seen[0].iter().rev().take(t - 1).copied())
                    .collect();
                let cache = &mut self.caches[0];
                super::verify_cost::verify_pass_by(model, cache, &tokens, Model::verify_eager)?;
                Ok(None)
            }
            Profiled::BatchStep(_) => {
                let mut refs: Vec<&mut Cache> = self.caches.iter_mut().collect();
                // The eager step (its launches counted), never a CUDA graph's replay.
                let step = model.decode_batch_with_launches(&self.tokens, &mut refs)?;
                Ok(Some(step.0))
            }
        }
    }

    /// The next tokens from a step's logits (greedy, as the benchmark decodes).
    fn pick(&mut self, model: &Model, logits: &Tensor, chunk: usize) -> Result<()> {
        self.tokens = match self.what {
            Profiled::BatchStep(_) => logits.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?,
            _ => vec![super::common::greedy(model, logits, &self.seen[0], chunk)?],
        };
        Ok(())
    }
}

pub(crate) struct DecodeProfile {
    what: Profiled,
    backend: &'static str,
    /// Cached positions before the profiled step.
    position: usize,
    /// Median wall time of an unprofiled eager step, drained before and after.
    wall: Duration,
    bandwidth: CopyBandwidth,
    /// Launches the profiled step counted (`gdn_ops::launches`): its kernels' and candle's.
    launches: usize,
    recording: Recording,
}

/// Prefills `prompt` as a bench repetition does, then times [`WALL_STEPS`] eager decode
/// steps and profiles one more.
pub(crate) fn profile_decode(
    model: &Model,
    prompt: &[u32],
    chunk: usize,
    what: Profiled,
) -> Result<DecodeProfile> {
    check_fused(model)?;
    let device = model.device();
    let bandwidth = profile::copy_bandwidth(device).context("measuring the copy bandwidth")?;
    let mut subject = Subject::prefill(model, prompt, chunk, what)?;
    // A warm-up step (kernels compiled and loaded, buffers pooled), then the timed ones; the
    // next tokens are read back after the clock stops.
    let mut times = Vec::with_capacity(WALL_STEPS);
    for _ in 0..=WALL_STEPS {
        device.synchronize()?;
        let start = Instant::now();
        let logits = subject.run(model)?;
        device.synchronize()?;
        times.push(start.elapsed());
        if let Some(logits) = logits {
            subject.pick(model, &logits, chunk)?;
        }
    }
    times.remove(0);
    times.sort();
    let position = subject.caches[0].offset;
    gdn_ops::launches::take();
    let session = profile::Session::start();
    let logits = subject.run(model)?;
    device.synchronize()?;
    let recording = session.finish();
    let launches = gdn_ops::launches::take();
    drop(logits);
    Ok(DecodeProfile {
        what,
        backend: super::common::backend_name(device),
        position,
        wall: times[times.len() / 2],
        bandwidth,
        launches,
        recording,
    })
}

/// Fails unless `model` decodes on the fused step (checked before the benchmark runs).
pub(crate) fn check_fused(model: &Model) -> Result<()> {
    if !model.fused_decode() {
        bail!(
            "--profile-decode profiles the fused decode step, which this model does not run \
             (the reference plan of f32 on the CPU, --composed-decode, or a family without \
             it): use --dtype bf16 on the CPU, or a GPU"
        );
    }
    Ok(())
}

/// Fails unless `model` verifies on the fused pass and the prompt holds the `t − 1` drafts'
/// ids (checked before the benchmark runs).
pub(crate) fn check_fused_verify(model: &Model, t: usize, prompt_tokens: usize) -> Result<()> {
    if !model.fused_verify() {
        bail!(
            "--profile-verify profiles the fused verify pass, which this model does not run \
             (the reference plan of f32 on the CPU, --composed-decode, or a family without \
             it): use --dtype bf16 on the CPU, or a GPU"
        );
    }
    if prompt_tokens < t {
        bail!("--profile-verify {t} needs a prompt of at least {t} tokens (-p)");
    }
    Ok(())
}

/// Rows summed under one key (an op, a layer kind).
#[derive(Default)]
struct Sum {
    calls: usize,
    launches: usize,
    time: Duration,
    read: u64,
    written: u64,
    /// Distinct layer indices (for the layer kinds).
    layers: Vec<usize>,
}

impl Sum {
    fn add(&mut self, row: &KernelRow) {
        self.calls += 1;
        self.launches += row.launches;
        self.time += row.time;
        self.read += row.traffic.read;
        self.written += row.traffic.written;
        if let Some(i) = row.place.index {
            if !self.layers.contains(&i) {
                self.layers.push(i);
            }
        }
    }
}

/// Sums of `rows` under `key`, in order of first appearance.
fn sums<K: PartialEq + Copy>(rows: &[KernelRow], key: impl Fn(&KernelRow) -> K) -> Vec<(K, Sum)> {
    let mut out: Vec<(K, Sum)> = Vec::new();
    for row in rows {
        let k = key(row);
        let at = match out.iter().position(|(o, _)| *o == k) {
            Some(at) => at,
            None => {
                out.push((k, Sum::default()));
                out.len() - 1
            }
        };
        out[at].1.add(row);
    }
    out
}

impl DecodeProfile {
    fn rows(&self) -> &[KernelRow] {
        &self.recording.kernels
    }

    fn rows_time(&self) -> Duration {
        self.rows().iter().map(|r| r.time).sum()
    }

    /// The step's wall time less the rows' (signed).
    fn remainder_seconds(&self) -> f64 {
        self.wall.as_secs_f64() - self.rows_time().as_secs_f64()
    }

    /// Bytes per second of `bytes` moved in `time`.
    fn rate(bytes: u64, time: Duration) -> f64 {
        bytes as f64 / time.as_secs_f64().max(1e-12)
    }

    fn of_copy(&self, rate: f64) -> f64 {
        100.0 * rate / self.bandwidth.bytes_per_second
    }

    fn by_kind(&self) -> Vec<(LayerKind, Sum)> {
        let mut kinds = sums(self.rows(), |r| r.place.kind);
        kinds.sort_by_key(|(k, _)| *k);
        kinds
    }

    pub(crate) fn table(&self) -> String {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let kb = |b: u64| b as f64 / 1e3;
        let rows_time = self.rows_time();
        let mut out = format!(
            "decode profile ({}): {} at position {}, B = {}, each kernel timed alone with the \
             device drained (not graph-replayed)\ncopy bandwidth {:.1} GB/s ({} MiB copy, read + \
             written bytes)\n",
            self.backend,
            self.what.describe(),
            self.position,
            self.what.sequences(),
            self.bandwidth.bytes_per_second / 1e9,
            self.bandwidth.buffer_bytes >> 20,
        );
        out += &format!(
            "{:>4} {:>5} {:<9} {:<25} {:<13} {:<23} {:<11} {:>9} {:>10} {:>10} {:>8} {:>7}\n",
            "#",
            "layer",
            "kind",
            "op",
            "label",
            "grid",
            "block",
            "µs",
            "read KB",
            "written KB",
            "GB/s",
            "% copy"
        );
        for (n, r) in self.rows().iter().enumerate() {
            let rate = Self::rate(r.traffic.total(), r.time);
            let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
            let grid: Vec<String> = r.grids.iter().map(|g| dims(g.grid)).collect();
            let block: Vec<String> = r.grids.iter().map(|g| dims(g.block)).collect();
            out += &format!(
                "{:>4} {:>5} {:<9} {:<25} {:<13} {:<23} {:<11} {:>9.1} {:>10.1} {:>10.1} {:>8.1} {:>7.1}\n",
                n,
                r.place.index.map_or("-".into(), |i| i.to_string()),
                r.place.kind.name(),
                r.op,
                r.label.unwrap_or(""),
                grid.join("+"),
                block.join("+"),
                us(r.time),
                kb(r.traffic.read),
                kb(r.traffic.written),
                rate / 1e9,
                self.of_copy(rate),
            );
        }
        let header = |what: &str| {
            format!(
                "{:<25} {:>6} {:>8} {:>10} {:>7} {:>10} {:>10} {:>8} {:>7}\n",
                what,
                "calls",
                "launches",
                "µs",
                "% rows",
                "read KB",
                "written KB",
                "GB/s",
                "% copy"
            )
        };
        let line = |name: &str, s: &Sum| {
            let rate = Self::rate(s.read + s.written, s.time);
            format!(
                "{:<25} {:>6} {:>8} {:>10.1} {:>7.1} {:>10.1} {:>10.1} {:>8.1} {:>7.1}\n",
                name,
                s.calls,
                s.launches,
                us(s.time),
                100.0 * s.time.as_secs_f64() / rows_time.as_secs_f64().max(1e-12),
                kb(s.read),
                kb(s.written),
                rate / 1e9,
                self.of_copy(rate),
            )
        };
        out += "\nby op\n";
        out += &header("op");
        let mut ops = sums(self.rows(), |r| r.op);
        ops.sort_by_key(|(_, s)| std::cmp::Reverse(s.time));
        for (op, s) in &ops {
            out += &line(op, s);
        }
        out += "\nby layer kind\n";
        out += &header("kind (layers)");
        for (kind, s) in self.by_kind() {
            let name = match kind {
                LayerKind::Outside => kind.name().to_string(),
                _ => format!("{} ({})", kind.name(), s.layers.len()),
            };
            out += &line(&name, &s);
        }
        let total = sums(self.rows(), |_| ())
            .pop()
            .map(|(_, s)| s)
            .unwrap_or_default();
        out += &line("all rows", &total);
        out += &format!(
            "\nstep: rows {:.1} µs + remainder {:.1} µs = wall {:.1} µs (an unprofiled eager step, \
             drained, median of {WALL_STEPS}); the remainder holds {} candle launch(es), untimed, \
             and the gaps between launches (negative: the rows, each timed alone, took longer \
             than the step)\nlaunches counted in the profiled step: {} ({} in the rows, {} \
             candle)\n",
            us(rows_time),
            self.remainder_seconds() * 1e6,
            us(self.wall),
            self.recording.candle_launches(),
            self.launches,
            self.recording.kernel_launches(),
            self.recording.candle_launches(),
        );
        out
    }

    pub(crate) fn json(&self) -> Value {
        let rate = |bytes: u64, time: Duration| Self::rate(bytes, time);
        let rows: Vec<Value> = self
            .rows()
            .iter()
            .map(|r| {
                let bps = rate(r.traffic.total(), r.time);
                json!({
                    "layer": r.place.index,
                    "layer_kind": r.place.kind.name(),
                    "op": r.op,
                    "label": r.label,
                    "launches": r.launches,
                    "grids": r.grids.iter().map(|g| json!({"grid": g.grid, "block": g.block})).collect::<Vec<_>>(),
                    "seconds": r.time.as_secs_f64(),
                    "bytes_read": r.traffic.read,
                    "bytes_written": r.traffic.written,
                    "bytes_per_second": bps,
                    "percent_of_copy": self.of_copy(bps),
                })
            })
            .collect();
        let sum_json = |key: Value, s: &Sum| {
            let bps = rate(s.read + s.written, s.time);
            json!({
                "key": key,
                "calls": s.calls,
                "launches": s.launches,
                "layers": s.layers.len(),
                "seconds": s.time.as_secs_f64(),
                "bytes_read": s.read,
                "bytes_written": s.written,
                "bytes_per_second": bps,
                "percent_of_copy": self.of_copy(bps),
            })
        };
        let rows_time = self.rows_time();
        json!({
            "profiled": self.what.describe(),
            "backend": self.backend,
            "position": self.position,
            "sequences": self.what.sequences(),
            "copy_bandwidth": {
                "bytes_per_second": self.bandwidth.bytes_per_second,
                "buffer_bytes": self.bandwidth.buffer_bytes,
                "repetitions": self.bandwidth.repetitions,
            },
            "kernels": rows,
            "by_op": sums(self.rows(), |r| r.op).iter().map(|(op, s)| sum_json(json!(op), s)).collect::<Vec<_>>(),
            "by_layer_kind": self.by_kind().iter().map(|(k, s)| sum_json(json!(k.name()), s)).collect::<Vec<_>>(),
            "rows_seconds": rows_time.as_secs_f64(),
            "wall_seconds": self.wall.as_secs_f64(),
            "wall_steps": WALL_STEPS,
            "remainder_seconds": self.remainder_seconds(),
            "launches": {
                "total": self.launches,
                "kernels": self.recording.kernel_launches(),
                "candle": self.recording.candle_launches(),
            },
        })
    }
}
