//! CUDA host side of `gated_delta_norm_window_*` (kernels/gated_delta_norm.cu): the plain op's
//! launch (`ops/gated_delta_norm/cuda.rs`: the entry, cluster or not, that a one-token launch
//! takes, so that every token's sums run in the same order) with the window's states as one
//! more argument.

use super::WindowInputs;
use crate::ops::gated_delta_norm::cuda::launch_entry;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gated_delta_update_norm_window(window: &WindowInputs) -> Result<Tensor> {
    launch_entry(
        &window.inputs,
        Some(window.after),
        "gated_delta_update_norm_window",
    )
}
