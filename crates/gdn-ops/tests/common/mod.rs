//! Shared by the fused kernels' tests (CPU twin, emulation, CUDA): an op's cases, once for every
//! backend (`<op>.rs`: `cases()`, its inputs, what the gates share; the gated delta rule's
//! inputs in `gated_delta.rs`), activation types, the GPU and its tolerances, the grouped
//! matmul's row offsets, reproducible random inputs, running cases on two threads, the harness
//! input encoding, and the tolerance checks.
#![allow(dead_code, unused_imports)]

/// An op's case shape and its positional constructor, `shape(…)` with the arguments in the
/// fields' order, from one list of fields: the case tables read `shape(1, 16, 2, 256, …)`.
macro_rules! shape_and_constructor {
    ($(#[$meta:meta])* pub struct Shape { $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        pub struct Shape {
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        #[allow(clippy::too_many_arguments)]
        pub const fn shape($($field: $ty),*) -> Shape {
            Shape { $($field),* }
        }
    };
}
pub(crate) use shape_and_constructor;

pub mod add_rms_norm;
pub mod affine;
pub mod affine_dense_rows;
pub mod affine_grouped;
pub mod attention;
pub mod attn_decode;
pub mod attn_prefill;
pub mod attn_prep;
pub mod compare;
pub mod dtype;
pub mod gated_delta;
pub mod gated_delta_norm;
pub mod gated_delta_norm_window;
pub mod gated_rms_norm;
pub mod gdn_conv_prep;
pub mod gpu;
pub mod greedy_pick;
pub mod harness_input;
pub mod hyper_connection;
pub mod indexer_pool;
pub mod moe_combine;
pub mod moe_route;
pub mod parallel;
pub mod random;
pub mod reference;
pub mod state_slots;

pub use attention::composed_causal_attention;
pub use compare::{
    assert_rel_err, close, max_abs, max_rel, rel_err, rel_l2, rel_max, values, worst_excess,
};
pub use dtype::{tensor, tensor_as, St, Ty, TYPES};
pub use gpu::{gpu, tolerance};
pub use harness_input::Input;
pub use parallel::{assert_no_failures, assert_none_failed, failures, failures_on_all_cores};
pub use random::{case_seed, random_matrix, scaled_matrix, seeds, Rng};
pub use reference::candle_nn_rms_norm;
