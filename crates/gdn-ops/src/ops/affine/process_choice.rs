//! A kernel choice that belongs to the process, not to one model (set by `Model::load` from
//! `RunOptions`, the last load winning, as for the CPU level), with a per-thread override for
//! the tests: the shape of [`super::DenseRows`] and [`super::DecodeProducts`], written once.

/// In the module where it is invoked, for a `Copy` enum `$ty` with `fn code(self) -> u8` and
/// `fn from_code(u8) -> Self` (code 0 its default): `$set(choice)` (the process's choice),
/// `$get()` (the choice in force on this thread), `scope(choice)` and its guard `Scope` (this
/// thread's choice until the guard drops: how a test compares the paths while other threads
/// load models, each load setting the process's choice).
macro_rules! process_choice {
    ($ty:ty, $set:ident, $get:ident) => {
        static CHOICE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

        thread_local! {
            /// A [`scope`]'s choice on this thread, over the process's.
            static SCOPED: std::cell::Cell<Option<$ty>> = const { std::cell::Cell::new(None) };
        }

        /// Sets the process's choice (the last model load wins).
        pub fn $set(choice: $ty) {
            CHOICE.store(choice.code(), std::sync::atomic::Ordering::Relaxed);
        }

        /// The choice in force on this thread: a [`scope`]'s, else the process's.
        pub fn $get() -> $ty {
            SCOPED.get().unwrap_or_else(|| {
                <$ty>::from_code(CHOICE.load(std::sync::atomic::Ordering::Relaxed))
            })
        }

        /// Runs this thread's products on `choice` until the guard drops (then the choice
        /// before it).
        pub fn scope(choice: $ty) -> Scope {
            Scope {
                before: SCOPED.replace(Some(choice)),
            }
        }

        /// The guard of [`scope`].
        #[must_use = "the choice holds while the guard lives"]
        pub struct Scope {
            before: Option<$ty>,
        }

        impl Drop for Scope {
            fn drop(&mut self) {
                SCOPED.set(self.before);
            }
        }
    };
}

pub(crate) use process_choice;
