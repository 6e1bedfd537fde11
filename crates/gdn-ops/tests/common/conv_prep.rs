//! `gdn_conv_prep`'s tests on every backend: the layer dims, and the check that a chunk's
//! outputs are its decode steps' outputs, bit for bit.

use super::compare::values;
use candle_core::Tensor;
use gdn_ops::ops::gdn_conv_prep::{ConvPrepDims, ConvPrepOut};

/// `Hk` key heads of `Dk`, `Hv` value heads of `Dv`, `K` taps.
pub fn conv_prep_dims(hk: usize, dk: usize, hv: usize, dv: usize, k: usize) -> ConvPrepDims {
    ConvPrepDims {
        key_heads: hk,
        key_dim: dk,
        value_heads: hv,
        value_dim: dv,
        kernel_size: k,
    }
}

/// `chunk` (one call over S tokens) against `steps` (S calls of one token each, advancing
/// `state` in place): every output equal bit for bit, and the chunk's new state equal to the
/// state the steps left.
pub fn assert_chunk_is_its_steps(
    what: &str,
    chunk: &ConvPrepOut,
    steps: &[ConvPrepOut],
    state: &Tensor,
) {
    let cat = |f: fn(&ConvPrepOut) -> &Tensor| {
        Tensor::cat(&steps.iter().map(f).collect::<Vec<_>>(), 1).unwrap()
    };
    for (name, got, want) in [
        ("q", &chunk.q, cat(|o| &o.q)),
        ("k", &chunk.k, cat(|o| &o.k)),
        ("v", &chunk.v, cat(|o| &o.v)),
        ("g", &chunk.g, cat(|o| &o.g)),
        ("beta", &chunk.beta, cat(|o| &o.beta)),
    ] {
        assert_eq!(values(got), values(&want), "{what}: {name}");
    }
    assert_eq!(
        values(&chunk.conv_state),
        values(state),
        "{what}: conv state"
    );
}
