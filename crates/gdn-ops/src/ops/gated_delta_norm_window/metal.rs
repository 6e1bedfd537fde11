//! Metal host side of `gated_delta_norm_window_*` (kernels/gated_delta_norm.metal): the plain
//! op's launch (`ops/gated_delta_norm/metal.rs`) with the window's states at buffer 9.

use super::WindowInputs;
use crate::ops::gated_delta_norm::metal::launch_entry;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gated_delta_update_norm_window(window: &WindowInputs) -> Result<Tensor> {
    launch_entry(
        &window.inputs,
        Some(window.after),
        "gated_delta_update_norm_window",
    )
}
