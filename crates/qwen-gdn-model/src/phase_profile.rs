//! Where a forward pass spends its time, phase by phase (`qwen-gdn bench --profile`).
//!
//! The phases of the layer loop are timed by a tap, [`PhaseTimer`]: `embed`, then per layer
//! `ple` (`qwen4_exp`), `gdn` or `attention` (the mixer with its norm and residual add),
//! `moe` or `mlp` (likewise), and `lm_head` (the final norm and the output head), each from
//! the tap event before it to its own. Inside the building blocks, whose steps the loop does
//! not see, the steps are named where their kernels are launched, with the launch layer's one
//! labelling call (`gdn_ops::profile::labelled("gdn/in_proj", …)`, which also names the
//! kernel profile's rows), and the timer watches those labels while it lives
//! (`gdn_ops::profile::steps`): no block keeps a timer of its own.
//!
//! On a GPU the host only queues work, so a host clock around a phase measures nothing unless
//! the device has drained first: the timer synchronizes the device at every event, and before
//! and after each labelled step, so each phase is charged with the device work it queued.
//! Those synchronizations cost time of their own (one host round trip each), so a profiled
//! pass is slower than an unprofiled one: the profile is for the split between phases, the
//! benchmark's own numbers for the speed. Off (the default), a step is one relaxed atomic
//! load.
//!
//! Phases nest by name: `moe/gate_up` is inside `moe`, and a report lists, under each parent,
//! its children and what the parent spent outside them.

use crate::tap::{Part, Tap};
use anyhow::Result;
use candle_core::Device;
use gdn_ops::profile::steps::{watch_steps, StepWatch, Watching};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Totals per phase name, in the order each name was first seen (so a report follows the
/// order of a layer's work). A handful of names: a linear search is the cheapest map.
static TOTALS: Mutex<Vec<PhaseTime>> = Mutex::new(Vec::new());

/// The accumulated time of one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseTime {
    /// `parent/child` path.
    pub name: &'static str,
    pub total: Duration,
    pub calls: u64,
}

/// The tap that times the phases of the layer loop, and the labelled steps inside the blocks
/// while it lives. One at a time: the totals are process-wide.
pub struct PhaseTimer {
    device: Device,
    /// When the last event was seen (the device drained then).
    mark: Instant,
    /// The labelled steps of every thread are timed until this drops (the reference plan
    /// runs layers on pool workers).
    _steps: Watching,
}

/// Times each labelled step, the device drained before and after it.
struct StepTimer(Device);

impl StepWatch for StepTimer {
    fn watch(&self, label: &'static str, step: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.0.synchronize()?;
        let start = Instant::now();
        step()?;
        self.0.synchronize()?;
        record(label, start.elapsed());
        Ok(())
    }
}

impl PhaseTimer {
    /// Clears the totals and starts timing passes on `device`.
    pub fn start(device: &Device) -> Self {
        take();
        Self {
            device: device.clone(),
            mark: Instant::now(),
            _steps: watch_steps(Arc::new(StepTimer(device.clone()))),
        }
    }

    /// Stops timing and returns the totals.
    pub fn finish(self) -> Vec<PhaseTime> {
        drop(self);
        take()
    }

    /// Drains the device and starts the next interval.
    fn mark(&mut self) -> Result<()> {
        self.device.synchronize()?;
        self.mark = Instant::now();
        Ok(())
    }

    /// The phase a part ends.
    fn name(part: Part) -> &'static str {
        match part {
            Part::Embedding => "embed",
            Part::PerLayerEmbedding { .. } => "ple",
            Part::Mixer {
                attention: true, ..
            } => "attention",
            Part::Mixer { .. } => "gdn",
            Part::FeedForward { moe: true, .. } => "moe",
            Part::FeedForward { .. } => "mlp",
            Part::OutputHead => "lm_head",
        }
    }
}

impl Tap for PhaseTimer {
    fn begin_pass(&mut self) -> Result<()> {
        self.mark()
    }

    fn enter_layer(&mut self, _layer: usize) -> Result<()> {
        self.mark()
    }

    fn part(
        &mut self,
        part: Part,
        _added: &candle_core::Tensor,
        _stream: &candle_core::Tensor,
    ) -> Result<()> {
        self.device.synchronize()?;
        let now = Instant::now();
        record(Self::name(part), now - self.mark);
        self.mark = now;
        Ok(())
    }
}

fn record(name: &'static str, elapsed: Duration) {
    let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    match totals.iter_mut().find(|t| t.name == name) {
        Some(t) => {
            t.total += elapsed;
            t.calls += 1;
        }
        None => totals.push(PhaseTime {
            name,
            total: elapsed,
            calls: 1,
        }),
    }
}

/// Returns the totals gathered so far and starts afresh.
fn take() -> Vec<PhaseTime> {
    std::mem::take(&mut *TOTALS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// One line of a report: a phase, or the time a parent spent outside its children
/// (`name` ends in `/(rest)`, `calls` 0).
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    pub name: String,
    pub depth: usize,
    pub total: Duration,
    pub calls: u64,
}

/// The phases as a tree in first-seen order: every parent is followed by its children, then
/// by a `(rest)` row for its time outside them when it has children. Phases whose parent was
/// never timed are listed at their own depth.
pub fn report(times: &[PhaseTime]) -> Vec<ReportRow> {
    let mut rows = Vec::new();
    for t in times
        .iter()
        .filter(|t| parent_of(t.name).is_none_or(|p| !known(times, p)))
    {
        push_subtree(times, t, 0, &mut rows);
    }
    rows
}

fn known(times: &[PhaseTime], name: &str) -> bool {
    times.iter().any(|t| t.name == name)
}

fn parent_of(name: &str) -> Option<&str> {
    name.rsplit_once('/').map(|(parent, _)| parent)
}

fn push_subtree(times: &[PhaseTime], t: &PhaseTime, depth: usize, rows: &mut Vec<ReportRow>) {
    rows.push(ReportRow {
        name: t.name.to_string(),
        depth,
        total: t.total,
        calls: t.calls,
    });
    let children: Vec<&PhaseTime> = times
        .iter()
        .filter(|c| parent_of(c.name) == Some(t.name))
        .collect();
    if children.is_empty() {
        return;
    }
    for c in &children {
        push_subtree(times, c, depth + 1, rows);
    }
    let inside: Duration = children.iter().map(|c| c.total).sum();
    rows.push(ReportRow {
        name: format!("{}/(rest)", t.name),
        depth: depth + 1,
        total: t.total.saturating_sub(inside),
        calls: 0,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdn_ops::profile::labelled;

    fn time(name: &'static str, ms: u64, calls: u64) -> PhaseTime {
        PhaseTime {
            name,
            total: Duration::from_millis(ms),
            calls,
        }
    }

    #[test]
    fn report_nests_children_under_parents_with_the_rest() {
        let times = [
            time("gdn", 10, 2),
            time("gdn/recurrence", 6, 2),
            time("moe", 20, 2),
            time("moe/gate_up", 8, 2),
            time("moe/down", 5, 2),
            time("lm_head", 1, 1),
        ];
        let rows = report(&times);
        let listed: Vec<(&str, usize, u64)> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.depth, r.total.as_millis() as u64))
            .collect();
        assert_eq!(
            listed,
            [
                ("gdn", 0, 10),
                ("gdn/recurrence", 1, 6),
                ("gdn/(rest)", 1, 4),
                ("moe", 0, 20),
                ("moe/gate_up", 1, 8),
                ("moe/down", 1, 5),
                ("moe/(rest)", 1, 7),
                ("lm_head", 0, 1),
            ]
        );
    }

    #[test]
    fn orphans_are_listed_and_nothing_is_listed_twice() {
        let times = [time("moe/down", 5, 1), time("attention", 3, 1)];
        let rows = report(&times);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["moe/down", "attention"]);
    }

    /// A block's step is named once, where its kernels are launched: the phase timer sees the
    /// label (children nested under their parent), and only while it lives.
    #[test]
    fn labelled_steps_are_timed_only_while_a_timer_lives() {
        // The one test that starts a timer: the totals are process-wide. Other tests' steps
        // may be timed meanwhile, so only this test's names are looked at.
        let dev = Device::Cpu;
        let mine = |times: Vec<PhaseTime>| -> Vec<(&'static str, u64)> {
            times
                .into_iter()
                .filter(|t| t.name.starts_with("timer_test"))
                .map(|t| (t.name, t.calls))
                .collect()
        };
        labelled("timer_test", || Ok(())).unwrap();
        let timer = PhaseTimer::start(&dev);
        let out = labelled("timer_test", || Ok(7)).unwrap();
        labelled("timer_test", || labelled("timer_test/inner", || Ok(()))).unwrap();
        let times = timer.finish();
        assert_eq!(out, 7);
        assert_eq!(mine(times), [("timer_test", 2), ("timer_test/inner", 1)]);
        labelled("timer_test", || Ok(())).unwrap();
        assert!(mine(take()).is_empty());
    }
}
