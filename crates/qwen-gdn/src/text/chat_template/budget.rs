//! The byte budget of one rendering: every string and list a template builds is counted
//! against it before it is allocated, so that a hostile template ends in an error instead of
//! exhausting memory (an allocation failure aborts the whole process, `serve` included).
//!
//! The budget is cumulative (bytes built over the whole rendering, not bytes alive at once):
//! that makes it deterministic and cheap to keep, and it also bounds the work of copying.
//! The rendering runs on one thread, so the budget lives in a thread-local that
//! [`Rendering`] sets for its duration; the checks outside a rendering pass.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::cell::Cell;
use std::fmt::Write;

/// What one template value costs when it is held in a list (minijinja's `Value`).
pub const VALUE_BYTES: usize = std::mem::size_of::<Value>();

thread_local! {
    /// Bytes the rendering on this thread may still build; `None` outside a rendering.
    static LEFT: Cell<Option<usize>> = const { Cell::new(None) };
    /// Set when a check failed, so that the caller can tell the budget's error from others
    /// (the template may have caught or rewrapped it).
    static EXCEEDED: Cell<bool> = const { Cell::new(false) };
    /// Set when a value nested too deep was refused.
    static TOO_DEEP: Cell<bool> = const { Cell::new(false) };
}

/// How deep the lists, maps and namespaces a template builds may nest. Printing, comparing
/// and dropping a value recurse once per level: a list nested a million deep (a loop of
/// `{% set ns.x = [ns.x] %}`) or a namespace that holds itself would overflow the stack.
/// Messages parsed from JSON are at most 128 deep (serde_json's limit).
pub const MAX_NESTING: usize = 256;

/// The budget of the rendering running on this thread, from `start` until dropped.
pub struct Rendering(());

impl Rendering {
    pub fn start(bytes: usize) -> Self {
        LEFT.set(Some(bytes));
        EXCEEDED.set(false);
        TOO_DEEP.set(false);
        Rendering(())
    }

    /// Whether the rendering asked for more than its budget.
    pub fn exceeded(&self) -> bool {
        EXCEEDED.get()
    }

    /// Whether the rendering built (or tried to) a value nested past [`MAX_NESTING`].
    pub fn too_deep(&self) -> bool {
        TOO_DEEP.get()
    }
}

impl Drop for Rendering {
    fn drop(&mut self) {
        LEFT.set(None);
        EXCEEDED.set(false);
        TOO_DEEP.set(false);
    }
}

/// Bytes the rendering may still build.
pub fn left() -> usize {
    LEFT.get().unwrap_or(usize::MAX)
}

/// The error of a request over the budget (the caller rewrites it into its own message).
pub fn over() -> Error {
    EXCEEDED.set(true);
    Error::new(
        ErrorKind::InvalidOperation,
        "the template's byte budget is spent",
    )
}

/// Refuses `bytes` more than what is left, before they are allocated; takes them otherwise.
pub fn charge(bytes: usize) -> Result<(), Error> {
    check(bytes)?;
    if let Some(left) = LEFT.get() {
        LEFT.set(Some(left - bytes));
    }
    Ok(())
}

/// Refuses a value of `bytes` more than what is left, without taking them: for a value that
/// costs nothing yet (a lazy list) but may be built later.
pub fn check(bytes: usize) -> Result<(), Error> {
    if bytes > left() {
        return Err(over());
    }
    Ok(())
}

/// `a * b + c`, or an amount over any budget when it overflows.
pub fn mul_add(a: usize, b: usize, c: usize) -> usize {
    a.checked_mul(b)
        .and_then(|x| x.checked_add(c))
        .unwrap_or(usize::MAX)
}

/// A `fmt::Write` that only counts, and fails past `max`: it measures what formatting a value
/// would produce without building it (and stops early on a huge one).
pub struct Counter {
    pub bytes: usize,
    max: usize,
}

impl Counter {
    pub fn new(max: usize) -> Self {
        Counter { bytes: 0, max }
    }
}

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.bytes = self.bytes.saturating_add(s.len());
        if self.bytes > self.max {
            return Err(std::fmt::Error);
        }
        Ok(())
    }
}

/// Bytes of `format!("{v}")` (what `~` and minijinja's filters print), counted without
/// building it; an error once it exceeds what is left.
pub fn display_len(v: &Value) -> Result<usize, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.len());
    }
    let mut count = Counter::new(left());
    match write!(count, "{v}") {
        Ok(()) => Ok(count.bytes),
        Err(_) if count.bytes > left() => Err(over()),
        Err(_) => Err(Error::new(
            ErrorKind::InvalidOperation,
            "value cannot be formatted",
        )),
    }
}

/// Bytes of a string value (0 for others).
pub fn str_len(v: &Value) -> usize {
    v.as_str().map_or(0, str::len)
}

/// How many items iterating `v` yields, counting an unsized iterable up to what the budget
/// could hold (a lazy list larger than that is refused).
pub fn items(v: &Value) -> Result<usize, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.len()); // an upper bound of its characters
    }
    if !matches!(
        v.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    ) {
        return Ok(0);
    }
    if let Some(n) = v.len() {
        return Ok(n);
    }
    let cap = left() / VALUE_BYTES + 1;
    let n = v.try_iter().map_or(0, |it| it.take(cap).count());
    if n == cap {
        return Err(over());
    }
    Ok(n)
}

/// What a value returned by a filter or method cost to build: its bytes for a string, its
/// items for a list or map (a lazy iterable costs nothing until built).
pub fn built_bytes(v: &Value) -> usize {
    match v.kind() {
        ValueKind::String => str_len(v),
        ValueKind::Seq | ValueKind::Map => v.len().unwrap_or(0).saturating_mul(VALUE_BYTES),
        _ => 0,
    }
}

/// Refuses `v` when it nests lists, maps or namespaces more than `levels` deep, or holds
/// `not_inside` (a namespace about to hold `v`, which would then hold itself). The walk stops
/// at that depth; each value it visits is charged one byte, so that the walks of a rendering
/// are bounded as its building is.
pub fn check_nesting(v: &Value, levels: usize, not_inside: Option<&Value>) -> Result<(), Error> {
    let is_map = match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => false,
        ValueKind::Map | ValueKind::Plain => true,
        _ => return Ok(()),
    };
    if levels == 0 || not_inside.is_some_and(|ns| minijinja::tests::is_sameas(v, ns)) {
        TOO_DEEP.set(true);
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deep",
        ));
    }
    // Objects that cannot be enumerated (a macro, `loop`) hold nothing to walk.
    let Ok(iter) = v.try_iter() else {
        return Ok(());
    };
    for item in iter {
        charge(1)?;
        let child = if is_map {
            v.get_item(&item).unwrap_or_default()
        } else {
            item
        };
        check_nesting(&child, levels - 1, not_inside)?;
    }
    Ok(())
}
