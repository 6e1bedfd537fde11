//! What a profile records and the thread's recording state: the rows' types, and the two
//! notes the launch layer makes ([`note_grid`] from the backends' launch functions,
//! [`note_candle`] from [`crate::launches::candle_ops`]). A leaf under [`super`] (it
//! imports nothing of this crate), so that the launch layer can note into the profile while
//! the profile's timer launches through the backend without a circle of imports.

use candle_core::{DType, Tensor};
use std::cell::{Cell, RefCell};
use std::time::Duration;

/// Bytes an op reads and writes, counted from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    pub read: u64,
    pub written: u64,
}

impl Traffic {
    /// Nothing yet; add terms with [`Traffic::read`] and [`Traffic::write`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` read.
    pub fn read(mut self, bytes: usize) -> Self {
        self.read += bytes as u64;
        self
    }

    /// Adds `bytes` written.
    pub fn write(mut self, bytes: usize) -> Self {
        self.written += bytes as u64;
        self
    }

    /// Adds a whole tensor read (its elements, whatever its layout).
    pub fn read_all(self, t: &Tensor) -> Self {
        self.read(tensor_bytes(t))
    }

    /// Adds a whole tensor written.
    pub fn write_all(self, t: &Tensor) -> Self {
        self.write(tensor_bytes(t))
    }

    pub fn total(&self) -> u64 {
        self.read + self.written
    }
}

/// Bytes of a tensor's elements.
pub fn tensor_bytes(t: &Tensor) -> usize {
    elems_bytes(t.elem_count(), t.dtype())
}

/// Bytes of `n` elements of `dtype`.
pub fn elems_bytes(n: usize, dtype: DType) -> usize {
    n * dtype.size_in_bytes()
}

/// The kind of layer a row ran in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerKind {
    Gdn,
    Attention,
    /// Before the first layer and after the last (embedding, first norm, output head).
    Outside,
}

impl LayerKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Gdn => "gdn",
            Self::Attention => "attention",
            Self::Outside => "outside",
        }
    }
}

/// Where a row ran: a layer's index and kind, or outside the layers (`index` None).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub index: Option<usize>,
    pub kind: LayerKind,
}

pub(super) const OUTSIDE: Place = Place {
    index: None,
    kind: LayerKind::Outside,
};

/// Grid and block of one launch (threadgroups and threads per threadgroup on Metal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// One op call.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRow {
    pub op: &'static str,
    /// The projection or role the caller named ([`super::labelled`]).
    pub label: Option<&'static str>,
    pub place: Place,
    /// One per launch on a GPU (an op may launch more than one kernel: a split attention and
    /// its combine pass); none on the CPU.
    pub grids: Vec<Grid>,
    /// Launches counted inside the call ([`crate::launches`]): the CPU twin counts as one.
    pub launches: usize,
    pub time: Duration,
    pub traffic: Traffic,
}

/// What a profiled stretch recorded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Recording {
    /// In call order.
    pub kernels: Vec<KernelRow>,
    /// Launches of candle ops (counted, not timed), per place, in order of first use.
    pub candle: Vec<(Place, usize)>,
}

impl Recording {
    pub fn candle_launches(&self) -> usize {
        self.candle.iter().map(|(_, n)| n).sum()
    }

    /// Launches of the kernel rows.
    pub fn kernel_launches(&self) -> usize {
        self.kernels.iter().map(|k| k.launches).sum()
    }
}

/// The row being recorded: its grids accumulate here.
pub(super) struct Open {
    pub(super) grids: Vec<Grid>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) recording: Recording,
    /// Some while a [`kernel`] call runs (an op inside another op's call is part of it).
    pub(super) open: Option<Open>,
}

thread_local! {
    pub(super) static ENABLED: Cell<bool> = const { Cell::new(false) };
    pub(super) static PLACE: Cell<Place> = const { Cell::new(OUTSIDE) };
    pub(super) static LABEL: Cell<Option<&'static str>> = const { Cell::new(None) };
    pub(super) static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Whether this thread is profiling.
pub fn enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// Notes a launch's grid and block into the open row (the backends' launch functions call
/// this for every launch).
pub fn note_grid(grid: [u32; 3], block: [u32; 3]) {
    if !enabled() {
        return;
    }
    STATE.with(|s| {
        if let Some(open) = s.borrow_mut().open.as_mut() {
            open.grids.push(Grid { grid, block });
        }
    });
}

/// Counts `n` candle launches at the current place, unless inside an op's row (whose
/// launches count them already).
pub fn note_candle(n: usize) {
    if !enabled() || n == 0 {
        return;
    }
    let place = PLACE.with(Cell::get);
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.open.is_some() {
            return;
        }
        let candle = &mut s.recording.candle;
        match candle.iter_mut().find(|(p, _)| *p == place) {
            Some((_, count)) => *count += n,
            None => candle.push((place, n)),
        }
    });
}
