//! The kernel profile of a decode step (`qwen-gdn bench --profile-decode`): every op of this
//! crate, when profiling is on, records one row with its name, the layer it ran in, the
//! projection it computed (a label the caller sets), the grid of each launch, its device time
//! and the bytes it read and wrote, counted from its arguments.
//!
//! - Each op wraps its backend dispatch in [`kernel`], with a [`Traffic`] computed from its
//!   arguments (the formula sits beside the op's spec, in its `mod.rs`): semantic bytes, what
//!   the op must move at the least (a gathered expert product reads only the rows of the
//!   experts it uses, the GDN state is read and written once), so that bytes over time is the
//!   bandwidth the kernel achieves on its job.
//! - The launch function of each backend notes the grid and block of every launch into the
//!   open row ([`note_grid`]); candle's own ops, which cannot be timed one by one here, are
//!   only counted ([`note_candle`], from [`crate::launches::candle_ops`]): their time shows as
//!   the remainder between the rows and the step's wall time.
//! - The model says which layer runs ([`layer`]) and which step of its work ([`labelled`]):
//!   the one way to name a step, which the rows carry and a step watcher ([`steps`], the
//!   model's phase timer) times.
//!
//! Timing ([`timer`]): on CUDA the op's own GPU time between two events, the stream drained
//! before and a short spin kernel queued ahead so that host launch latency is not counted; on
//! Metal the host clock with the device drained before and after; on the CPU the twin's wall
//! time.
//!
//! The state is per thread (the device plan runs a step on the calling thread): profiling one
//! thread leaves the others untouched, and off (the default) each op pays one thread-local
//! load.

mod copy_bandwidth;
#[cfg(feature = "cuda")]
mod cuda;
pub mod steps;
mod timer;

pub(crate) mod record;

pub use copy_bandwidth::{copy_bandwidth, CopyBandwidth};
pub use record::{
    elems_bytes, enabled, note_candle, note_grid, tensor_bytes, Grid, KernelRow, LayerKind, Place,
    Recording, Traffic,
};

use anyhow::Result;
use candle_core::Device;
use record::{Open, State, ENABLED, LABEL, PLACE, STATE};
use std::cell::Cell;

/// Profiling on this thread from [`Session::start`] to [`Session::finish`] (or the drop).
pub struct Session(());

impl Session {
    /// Clears what an earlier session left and starts recording.
    pub fn start() -> Self {
        STATE.with(|s| *s.borrow_mut() = State::default());
        ENABLED.with(|e| e.set(true));
        Session(())
    }

    /// Stops recording and returns the rows.
    pub fn finish(self) -> Recording {
        ENABLED.with(|e| e.set(false));
        STATE.with(|s| std::mem::take(&mut s.borrow_mut().recording))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        ENABLED.with(|e| e.set(false));
    }
}

/// Runs one op's backend dispatch `f` as a row named `op` on `device`: with profiling off,
/// just `f`. On, `traffic` is evaluated first (it may read a position back from the device:
/// only then), and `f` is timed ([`timer`]) with its launches and grids noted. An op called
/// inside another's `f` is part of that row, not a row of its own.
pub fn kernel<R>(
    op: &'static str,
    device: &Device,
    traffic: impl FnOnce() -> Result<Traffic>,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if !enabled() || STATE.with(|s| s.borrow().open.is_some()) {
        return f();
    }
    let traffic = traffic()?;
    STATE.with(|s| s.borrow_mut().open = Some(Open { grids: Vec::new() }));
    // Closes the row however `f` ends, so that an error leaves no row open.
    struct Close;
    impl Drop for Close {
        fn drop(&mut self) {
            STATE.with(|s| s.borrow_mut().open = None);
        }
    }
    let close = Close;
    let before = crate::launches::count();
    let (out, time) = timer::time(device, f)?;
    let launches = crate::launches::count() - before;
    let grids = STATE.with(|s| {
        s.borrow_mut()
            .open
            .take()
            .map(|o| o.grids)
            .unwrap_or_default()
    });
    drop(close);
    let row = KernelRow {
        op,
        label: LABEL.with(Cell::get),
        place: PLACE.with(Cell::get),
        grids,
        launches,
        time,
        traffic,
    };
    STATE.with(|s| s.borrow_mut().recording.kernels.push(row));
    Ok(out)
}

/// Marks the rows recorded until the returned guard drops as those of layer `index` of
/// `kind` (outside the layers again afterwards).
pub fn layer(index: usize, kind: LayerKind) -> LayerScope {
    let place = Place {
        index: Some(index),
        kind,
    };
    LayerScope(PLACE.with(|p| p.replace(place)))
}

/// See [`layer`].
pub struct LayerScope(Place);

impl Drop for LayerScope {
    fn drop(&mut self) {
        PLACE.with(|p| p.set(self.0));
    }
}

/// Runs `f`, the step `label` of the caller's work (a projection, `gdn.in_proj`, or a block's
/// step, `gdn/recurrence`): its kernel rows carry the label, and the step watcher, if one is
/// set ([`steps::watch_steps`]), sees it run. Nested labels replace the outer one on the rows
/// for their extent; a watcher sees each.
pub fn labelled<R>(label: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let outer = LABEL.with(|l| l.replace(Some(label)));
    // Restored however `f` ends (a panic included), so a label never leaks to later rows.
    struct Restore(Option<&'static str>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LABEL.with(|l| l.set(self.0));
        }
    }
    let _restore = Restore(outer);
    match steps::watcher() {
        Some(watch) => steps::run_watched(&*watch, label, f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::record::OUTSIDE;
    use super::*;

    fn traffic(read: usize, written: usize) -> impl FnOnce() -> Result<Traffic> {
        move || Ok(Traffic::new().read(read).write(written))
    }

    /// Stands in for a CPU twin: one launch.
    fn twin() -> Result<u32> {
        crate::launches::cpu_twin(|| Ok(7))
    }

    #[test]
    fn off_records_nothing_and_evaluates_no_traffic() {
        let dev = Device::Cpu;
        let out = kernel(
            "op",
            &dev,
            || panic!("traffic is only counted when profiling"),
            twin,
        )
        .unwrap();
        assert_eq!(out, 7);
        note_candle(3);
        note_grid([1, 1, 1], [32, 1, 1]);
        let session = Session::start();
        assert_eq!(session.finish(), Recording::default());
    }

    #[test]
    fn rows_carry_place_label_launches_and_traffic() {
        let dev = Device::Cpu;
        let session = Session::start();
        kernel("embed", &dev, traffic(10, 20), twin).unwrap();
        {
            let _layer = layer(0, LayerKind::Gdn);
            labelled("gdn.in_proj", || {
                kernel("affine_products", &dev, traffic(100, 8), twin)
            })
            .unwrap();
            // The same op twice: two rows, in order.
            kernel("affine_products", &dev, traffic(200, 8), twin).unwrap();
            crate::launches::candle_op(Ok(())).unwrap();
        }
        {
            let _layer = layer(1, LayerKind::Attention);
            crate::launches::candle_ops(2, Ok(())).unwrap();
        }
        crate::launches::candle_op(Ok(())).unwrap();
        let rec = session.finish();
        let rows: Vec<_> = rec
            .kernels
            .iter()
            .map(|k| (k.op, k.label, k.place.index, k.place.kind, k.launches))
            .collect();
        assert_eq!(
            rows,
            [
                ("embed", None, None, LayerKind::Outside, 1),
                (
                    "affine_products",
                    Some("gdn.in_proj"),
                    Some(0),
                    LayerKind::Gdn,
                    1
                ),
                ("affine_products", None, Some(0), LayerKind::Gdn, 1),
            ]
        );
        assert_eq!(
            rec.kernels[1].traffic,
            Traffic {
                read: 100,
                written: 8
            }
        );
        assert_eq!(rec.kernels[2].traffic.total(), 208);
        assert!(rec.kernels.iter().all(|k| k.grids.is_empty()));
        let layer1 = Place {
            index: Some(1),
            kind: LayerKind::Attention,
        };
        let layer0 = Place {
            index: Some(0),
            kind: LayerKind::Gdn,
        };
        assert_eq!(rec.candle, [(layer0, 1), (layer1, 2), (OUTSIDE, 1)]);
        assert_eq!((rec.kernel_launches(), rec.candle_launches()), (3, 4));
        // A finished session leaves profiling off and the label and place reset.
        assert!(!enabled());
        assert_eq!(PLACE.with(Cell::get), OUTSIDE);
        assert_eq!(LABEL.with(Cell::get), None);
    }

    #[test]
    fn a_nested_op_is_part_of_the_outer_row() {
        let dev = Device::Cpu;
        let session = Session::start();
        kernel("outer", &dev, traffic(1, 1), || {
            note_grid([4, 1, 1], [32, 8, 1]);
            crate::launches::record(1);
            crate::launches::candle_op(Ok(()))?;
            kernel("inner", &dev, traffic(5, 5), || {
                note_grid([2, 1, 1], [32, 1, 1]);
                crate::launches::record(1);
                Ok(())
            })
        })
        .unwrap();
        let rec = session.finish();
        assert_eq!(rec.kernels.len(), 1);
        let row = &rec.kernels[0];
        assert_eq!((row.op, row.launches), ("outer", 3));
        assert_eq!(
            row.traffic,
            Traffic {
                read: 1,
                written: 1
            }
        );
        assert_eq!(
            row.grids,
            [
                Grid {
                    grid: [4, 1, 1],
                    block: [32, 8, 1]
                },
                Grid {
                    grid: [2, 1, 1],
                    block: [32, 1, 1]
                }
            ]
        );
        assert!(rec.candle.is_empty(), "{:?}", rec.candle);
    }

    #[test]
    fn a_failing_op_leaves_no_row_open() {
        let dev = Device::Cpu;
        let session = Session::start();
        let err = kernel("fails", &dev, traffic(1, 1), || -> Result<()> {
            anyhow::bail!("boom")
        });
        assert!(err.is_err());
        kernel("next", &dev, traffic(1, 1), twin).unwrap();
        let rec = session.finish();
        let ops: Vec<_> = rec.kernels.iter().map(|k| k.op).collect();
        assert_eq!(ops, ["next"]);
    }

    #[test]
    fn a_dropped_session_turns_profiling_off() {
        let session = Session::start();
        assert!(enabled());
        drop(session);
        assert!(!enabled());
    }

    /// Notes the steps of the thread that set it, as `(label, depth)` on entry.
    struct Notes {
        thread: std::thread::ThreadId,
        seen: std::sync::Mutex<Vec<(&'static str, usize)>>,
        depth: std::sync::atomic::AtomicUsize,
    }

    impl steps::StepWatch for Notes {
        fn watch(&self, label: &'static str, step: &mut dyn FnMut() -> Result<()>) -> Result<()> {
            use std::sync::atomic::Ordering::Relaxed;
            if std::thread::current().id() != self.thread {
                return step();
            }
            let depth = self.depth.fetch_add(1, Relaxed);
            self.seen.lock().unwrap().push((label, depth));
            let out = step();
            self.depth.fetch_sub(1, Relaxed);
            out
        }
    }

    #[test]
    fn one_label_names_the_rows_and_the_watched_step() {
        let dev = Device::Cpu;
        let notes = std::sync::Arc::new(Notes {
            thread: std::thread::current().id(),
            seen: Default::default(),
            depth: Default::default(),
        });
        let session = Session::start();
        let watching = steps::watch_steps(notes.clone());
        let out = labelled("moe", || {
            kernel("moe_route", &dev, traffic(1, 1), twin)?;
            labelled("moe/down", || {
                kernel("affine_products", &dev, traffic(2, 2), twin)
            })
        })
        .unwrap();
        drop(watching);
        // Not watched any more: still labelled on the rows.
        labelled("lm_head", || {
            kernel("affine_products", &dev, traffic(3, 3), twin)
        })
        .unwrap();
        let rec = session.finish();
        assert_eq!(out, 7);
        assert_eq!(*notes.seen.lock().unwrap(), [("moe", 0), ("moe/down", 1)]);
        let rows: Vec<_> = rec.kernels.iter().map(|k| (k.op, k.label)).collect();
        assert_eq!(
            rows,
            [
                ("moe_route", Some("moe")),
                ("affine_products", Some("moe/down")),
                ("affine_products", Some("lm_head")),
            ]
        );
    }
}
