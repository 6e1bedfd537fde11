//! CUDA host side of `kernels/attn_prep.cu`: one warp per head task.

use super::{AttnPrepDims, AttnPrepParams, Inputs};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, LaunchArgs, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "attn_prep";
const SOURCE: KernelSource = cuda_source!("attn_prep");

// SAFETY: `AttnPrepParams` is `repr(C)` of six u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AttnPrepParams {}

pub(crate) fn attn_prep(d: AttnPrepDims, inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(inputs.qkv, OP)?;
    ensure!(d.batch <= 65535, "{OP}: at most 65535 sequences per call");
    let qkv = inputs.qkv.contiguous()?;
    let (q_norm, k_norm, inv_freq) = (
        inputs.q_norm.contiguous()?,
        inputs.k_norm.contiguous()?,
        inputs.inv_freq.contiguous()?,
    );
    let eps = inputs.eps;
    let inputs = [
        &qkv,
        &q_norm,
        &k_norm,
        &inv_freq,
        inputs.pos,
        inputs.keys,
        inputs.values,
    ];
    with_float_type!(qkv.dtype(), OP, |T| run::<T>(d, eps, inputs, &dev))
}

/// `inputs`: qkv, q_norm, k_norm, inv_freq, pos, keys, values (contiguous).
fn run<T>(
    d: AttnPrepDims,
    eps: f32,
    inputs: [&Tensor; 7],
    dev: &CudaDevice,
) -> Result<(Tensor, Tensor)>
where
    T: Element,
{
    let kernel = Kernel::typed(dev, &SOURCE, "attn_prep", &[T::DTYPE], OP)?;
    let q_len = d.batch * d.q_heads * d.head_dim;
    // SAFETY: the kernel writes every element of q and gate.
    let q = unsafe { dev.alloc::<T>(q_len)? };
    let gate = unsafe { dev.alloc::<T>(q_len)? };
    {
        let [qkv, q_norm, k_norm, inv_freq, pos, keys, values] = inputs;
        let held = HeldInputs::new([qkv, q_norm, k_norm, inv_freq]);
        let views = held.views::<T>(OP)?;
        let [pos, keys, values] = [pos, keys, values].map(Held::new);
        let p_view = pos.view::<u32>(OP)?;
        // Written in place through these views; candle's single stream orders the writes
        // after earlier readers of the buffers.
        let k_view = keys.view::<T>(OP)?;
        let v_view = values.view::<T>(OP)?;
        let params = d.params(eps);
        let mut args = kernel.args();
        views.push(&mut args);
        args.arg(&p_view)
            .arg(&k_view)
            .arg(&v_view)
            .arg(&q)
            .arg(&gate)
            .arg(&params);
        let heads = (d.q_heads + 2 * d.kv_heads) as u32;
        let geometry = config((heads, d.batch as u32, 1), (32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `attn_prep_*` in kernels/attn_prep.cu;
        // the views cover the shapes checked in ops/attn_prep/mod.rs.
        unsafe { launch(args, geometry) }?;
    }
    Ok((
        tensor(q, dev, (d.batch, d.q_heads, d.head_dim)),
        tensor(gate, dev, (d.batch, d.q_heads * d.head_dim)),
    ))
}

/// The inputs both prep launches bind before the KV (the per-sequence launch's buffers and
/// position, the slot launch's table of them): qkv, q_norm, k_norm (contiguous, `T`) and
/// inv_freq (f32), read-locked while their views are bound.
pub(crate) struct HeldInputs<'a>([Held<'a>; 4]);

/// The device views of [`HeldInputs`], in the kernels' argument order.
pub(crate) struct InputViews<'a, T> {
    qkv: CudaView<'a, T>,
    q_norm: CudaView<'a, T>,
    k_norm: CudaView<'a, T>,
    inv_freq: CudaView<'a, f32>,
}

impl<'a> HeldInputs<'a> {
    /// `[qkv, q_norm, k_norm, inv_freq]`, each contiguous.
    pub(crate) fn new(inputs: [&'a Tensor; 4]) -> Self {
        Self(inputs.map(Held::new))
    }

    pub(crate) fn views<T: Element>(&self, op: &str) -> Result<InputViews<'_, T>> {
        let [qkv, q_norm, k_norm, inv_freq] = &self.0;
        Ok(InputViews {
            qkv: qkv.view(op)?,
            q_norm: q_norm.view(op)?,
            k_norm: k_norm.view(op)?,
            inv_freq: inv_freq.view(op)?,
        })
    }
}

impl<'a, T: Element> InputViews<'a, T> {
    /// qkv, q_norm, k_norm, inv_freq: the kernels' leading arguments.
    pub(crate) fn push(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.qkv)
            .arg(&self.q_norm)
            .arg(&self.k_norm)
            .arg(&self.inv_freq);
    }
}
