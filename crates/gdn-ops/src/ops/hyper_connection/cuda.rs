//! CUDA host side of `kernels/hyper_connection.cu`: `hc_inject_norm` one block per stream
//! row (a thread a column when the rows are fewer than the SMs: [`inject_row_threads`]), or
//! at decode each row over a thread-block cluster ([`inject_uses_cluster`]),
//! `hc_act` and `hc_mix` one thread per output value, `hc_up_mix` one warp per output value
//! (its lanes split among the streams).

use super::{
    inject_cluster_threads, inject_row_threads, inject_uses_cluster, ActInputs, InjectInputs,
    MixInputs, INJECT_CLUSTER_BLOCKS, MAX_COLS, MIX_THREADS, PER_THREAD,
};
use super::{HcActParams, HcInjectNormParams, HcMixParams, HcUpMixParams};
use super::{UpMixInputs, UP_MIX_WARPS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, view_or, with_float_type, with_float_types,
    Element, Held, Kernel, KernelSource,
};
use crate::ops::affine::cuda::{sms, HeldWeights};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const SOURCE: KernelSource = cuda_source!("hyper_connection");
// SAFETY: `repr(C)` of u32s and an f32, as the kernels' structs.
unsafe impl DeviceRepr for HcInjectNormParams {}
unsafe impl DeviceRepr for HcMixParams {}
unsafe impl DeviceRepr for HcActParams {}
unsafe impl DeviceRepr for HcUpMixParams {}

pub(crate) fn hc_inject_norm(inputs: &InjectInputs) -> Result<(Option<Tensor>, Option<Tensor>)> {
    const OP: &str = "hc_inject_norm";
    let dev = cuda_device(&inputs.hs, OP)?;
    with_float_type!(inputs.hs.dtype(), OP, |T| run_inject_norm::<T>(
        inputs, &dev
    ))
}

fn run_inject_norm<T: Element>(
    inputs: &InjectInputs,
    dev: &CudaDevice,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    const OP: &str = "hc_inject_norm";
    let p = inputs.params;
    let (rows, cols) = ((p.tokens * p.streams) as usize, p.cols as usize);
    ensure!(
        cols <= MAX_COLS && cols <= PER_THREAD * 1024,
        "{OP}: {cols} columns exceed the kernel's {MAX_COLS}"
    );
    let sms = sms(dev)?;
    let cluster = inject_uses_cluster(rows, cols, sms, inputs.kernel);
    let name = if cluster {
        "hc_inject_norm_cluster"
    } else {
        "hc_inject_norm"
    };
    let kernel = Kernel::typed(dev, &SOURCE, name, &[T::DTYPE], OP)?;
    let len = rows * cols;
    // SAFETY: the kernel writes every element of sum with an injection, of normed with a norm.
    let sum = match inputs.inject {
        Some(_) => Some(unsafe { dev.alloc::<T>(len)? }),
        None => None,
    };
    let normed = match inputs.weight {
        Some(_) => Some(unsafe { dev.alloc::<T>(len)? }),
        None => None,
    };
    // The weight slots without a norm or slots: never read, but valid f32 pointers.
    let no_weight = match (&inputs.weight, &inputs.slot_weights) {
        (Some(_), Some(_)) => None,
        _ => Some(dev.alloc_zeros::<f32>(1)?),
    };
    {
        let hs = Held::new(&inputs.hs);
        let y = inputs.inject.as_ref().map(|(y, _)| Held::new(y));
        let g = inputs.inject.as_ref().map(|(_, g)| Held::new(g));
        let w = inputs.weight.as_ref().map(Held::new);
        let slot_w = inputs.slot_weights.as_ref().map(Held::new);
        let hs_view = hs.view::<T>(OP)?;
        // Never read without an injection (has_inject = 0).
        let y_view = view_or::<T>(&y, &hs, OP)?;
        let g_view = view_or::<T>(&g, &hs, OP)?;
        let w_view = w.as_ref().map(|w| w.view::<f32>(OP)).transpose()?;
        let slot_w_view = slot_w.as_ref().map(|w| w.view::<f32>(OP)).transpose()?;
        let mut args = kernel.args();
        args.arg(&hs_view).arg(&y_view).arg(&g_view);
        for view in [&w_view, &slot_w_view] {
            match (view, &no_weight) {
                (Some(v), _) => args.arg(v),
                (None, Some(z)) => args.arg(z),
                (None, None) => unreachable!("a weight or its stand-in"),
            };
        }
        // An absent output's slot holds the other one: never written there.
        match (&sum, &normed) {
            (Some(s), Some(n)) => args.arg(s).arg(n),
            (Some(s), None) => args.arg(s).arg(s),
            (None, Some(n)) => args.arg(n).arg(n),
            (None, None) => unreachable!("checked in mod.rs: an injection or a norm"),
        };
        args.arg(&p);
        // A cluster's block takes an INJECT_CLUSTER_BLOCKS-th of a row; the grid is whole
        // clusters (the kernel's __cluster_dims__), a row each.
        let (blocks, threads) = if cluster {
            (rows * INJECT_CLUSTER_BLOCKS, inject_cluster_threads(cols))
        } else {
            (rows, inject_row_threads(rows, cols, sms))
        };
        let geometry = config((blocks as u32, 1, 1), (threads as u32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `hc_inject_norm_*` and
        // `hc_inject_norm_cluster_*` in kernels/hyper_connection.cu (the same); hs, sum and
        // normed hold N·S·H elements, y N·H (N·K·H with K slots), the gate logits N·S, the
        // weight S·H (f32), the slot weights N·K. Both kernels guard every column past H.
        unsafe { launch(args, geometry) }?;
    }
    let shape = inputs.hs.shape().clone();
    Ok((
        sum.map(|s| tensor(s, dev, shape.clone())),
        normed.map(|n| tensor(n, dev, shape.clone())),
    ))
}

pub(crate) fn hc_mix(inputs: &MixInputs) -> Result<Tensor> {
    const OP: &str = "hc_mix";
    let dev = cuda_device(&inputs.up, OP)?;
    with_float_type!(inputs.up.dtype(), OP, |T| run_mix::<T>(inputs, &dev))
}

fn run_mix<T: Element>(inputs: &MixInputs, dev: &CudaDevice) -> Result<Tensor> {
    const OP: &str = "hc_mix";
    let p = inputs.params;
    let len = (p.tokens * p.cols) as usize;
    let kernel = Kernel::typed(dev, &SOURCE, "hc_mix", &[T::DTYPE], OP)?;
    // SAFETY: the kernel writes every one of the N·H values.
    let x = unsafe { dev.alloc::<T>(len)? };
    {
        let (up, normed) = (Held::new(&inputs.up), Held::new(&inputs.normed));
        let (up_view, normed_view) = (up.view::<T>(OP)?, normed.view::<T>(OP)?);
        let mut args = kernel.args();
        args.arg(&up_view).arg(&normed_view).arg(&x).arg(&p);
        let blocks = len.div_ceil(MIX_THREADS) as u32;
        let geometry = config((blocks, 1, 1), (MIX_THREADS as u32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `hc_mix_*` in
        // kernels/hyper_connection.cu; up and normed hold N·S·H elements, x N·H.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(x, dev, (p.tokens as usize, p.cols as usize)))
}

pub(crate) fn hc_act(inputs: &ActInputs) -> Result<Tensor> {
    const OP: &str = "hc_act";
    let dev = cuda_device(&inputs.d, OP)?;
    with_float_type!(inputs.d.dtype(), OP, |T| run_act::<T>(inputs, &dev))
}

fn run_act<T: Element>(inputs: &ActInputs, dev: &CudaDevice) -> Result<Tensor> {
    const OP: &str = "hc_act";
    let p = inputs.params;
    let len = p.len as usize;
    let kernel = Kernel::typed(dev, &SOURCE, "hc_act", &[T::DTYPE], OP)?;
    // SAFETY: the kernel writes every one of the len values.
    let a = unsafe { dev.alloc::<T>(len)? };
    {
        let d = Held::new(&inputs.d);
        let d_view = d.view::<T>(OP)?;
        let mut args = kernel.args();
        args.arg(&d_view).arg(&a).arg(&p);
        let blocks = len.div_ceil(MIX_THREADS) as u32;
        let geometry = config((blocks, 1, 1), (MIX_THREADS as u32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `hc_act_*` in
        // kernels/hyper_connection.cu; d and a hold len elements.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(a, dev, len))
}

pub(crate) fn hc_up_mix(inputs: &UpMixInputs) -> Result<Tensor> {
    const OP: &str = "hc_up_mix";
    let dev = cuda_device(&inputs.normed, OP)?;
    with_float_types!(
        inputs.normed.dtype(),
        inputs.up.scales.dtype(),
        OP,
        |X, S| run_up_mix::<X, S>(inputs, &dev)
    )
}

fn run_up_mix<X: Element, S: Element>(inputs: &UpMixInputs, dev: &CudaDevice) -> Result<Tensor> {
    const OP: &str = "hc_up_mix";
    let p = inputs.params;
    ensure!(
        p.tokens <= 65535,
        "{OP}: {} tokens exceed the CUDA grid",
        p.tokens
    );
    let len = (p.tokens * p.cols) as usize;
    let kernel = Kernel::typed(dev, &SOURCE, "hc_up_mix", &[X::DTYPE, S::DTYPE], OP)?;
    // SAFETY: the kernel writes every one of the N·H values.
    let x = unsafe { dev.alloc::<X>(len)? };
    {
        let weights = HeldWeights::new(inputs.up);
        let views = weights.views::<S>(OP)?;
        let (d, normed) = (Held::new(&inputs.d), Held::new(&inputs.normed));
        let (d_view, normed_view) = (d.view::<X>(OP)?, normed.view::<X>(OP)?);
        let mut args = kernel.args();
        views.push(&mut args);
        args.arg(&d_view).arg(&normed_view).arg(&x).arg(&p);
        let blocks = (p.cols as usize).div_ceil(UP_MIX_WARPS) as u32;
        // The token's R activations in f32, shared by the block's warps.
        let shared = p.rank as usize * std::mem::size_of::<f32>();
        let geometry = config((blocks, p.tokens, 1), (32, UP_MIX_WARPS as u32, 1), shared);
        // SAFETY: arguments in the order and types of `hc_up_mix_*` in
        // kernels/hyper_connection.cu; the weights hold S·H rows of R columns, d N·R values,
        // normed N·S·H, x N·H.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(x, dev, (p.tokens as usize, p.cols as usize)))
}
