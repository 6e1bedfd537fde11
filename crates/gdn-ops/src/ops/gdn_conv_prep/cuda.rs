//! CUDA host side of `kernels/gdn_conv_prep.cu`: binding and launch geometry, on candle's
//! stream (so the conv-state update, in place for a decode step, orders with candle's own
//! ops).

use super::{supports, ConvPrepDims, ConvPrepOut, ConvPrepParams, Inputs};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchArgs, PushKernelArg,
};
use candle_core::CudaDevice;
use candle_core::{DType, Tensor};

const OP: &str = "gdn_conv_prep";
const SOURCE: KernelSource = cuda_source!("gdn_conv_prep");

// SAFETY: `ConvPrepParams` is `repr(C)` of thirteen u32 and three f32, as the kernel's struct.
unsafe impl DeviceRepr for ConvPrepParams {}

/// Warps (head slots) per block.
pub(crate) const SLOTS_PER_BLOCK: u32 = 4;

pub(crate) fn gdn_conv_prep(inputs: &Inputs) -> Result<ConvPrepOut> {
    let (dev, dtype) = checked_device(inputs, OP)?;
    ensure!(
        inputs.batch <= 65535 && inputs.tokens <= 65535,
        "{OP}: a batch of {} by {} tokens exceeds the CUDA grid (65535 each)",
        inputs.batch,
        inputs.tokens
    );
    with_float_type!(dtype, OP, |T| launch_as::<T>(inputs, &dev))
}

fn launch_as<T>(inputs: &Inputs, dev: &CudaDevice) -> Result<ConvPrepOut>
where
    T: Element,
{
    let kernel = Kernel::typed(dev, &SOURCE, "gdn_conv_prep", &[T::DTYPE], OP)?;
    let params = inputs.params()?;
    let d = inputs.dims;
    let (bn, s) = (inputs.batch, inputs.tokens);
    let out = Outputs::<T>::alloc(dev, d, bn * s)?;
    // A decode step shifts the state in place (each element read, then written, by one
    // thread). A chunk's tokens all read the old state: the last token's blocks write the
    // new one to its own buffer. SAFETY: the last token's blocks write every element.
    let fresh_state = if s > 1 {
        Some(unsafe { dev.alloc::<T>(inputs.conv_state.elem_count())? })
    } else {
        None
    };
    {
        let held = HeldInputs::new(inputs);
        let views = held.views::<T>(inputs, OP)?;
        let state_held = Held::new(inputs.conv_state);
        let state = state_held.view::<T>(OP)?;
        let mut args = kernel.args();
        views.push_rows(&mut args);
        args.arg(&state);
        match &fresh_state {
            Some(next) => args.arg(next),
            None => args.arg(&state),
        };
        views.push_layer(&mut args);
        out.push(&mut args);
        args.arg(&params);
        let slot_blocks = (d.slots() as u32).div_ceil(SLOTS_PER_BLOCK);
        let geometry = config(
            (slot_blocks, s as u32, bn as u32),
            (32, SLOTS_PER_BLOCK, 1),
            0,
        );
        // SAFETY: arguments in the order and types of `gdn_conv_prep_*` in
        // kernels/gdn_conv_prep.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    let [q, k, v, g, beta] = out.into_tensors(dev, d, (bn, s));
    Ok(ConvPrepOut {
        q,
        k,
        v,
        g,
        beta,
        conv_state: match fresh_state {
            Some(next) => tensor(next, dev, inputs.conv_state.dims()),
            None => inputs.conv_state.clone(),
        },
    })
}

/// The five outputs of both conv-front launches (q, k, v in `T`, g and beta in f32), for
/// `rows` (sequence, token) rows.
pub(crate) struct Outputs<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
}

impl<T: Element> Outputs<T> {
    pub(crate) fn alloc(dev: &CudaDevice, d: ConvPrepDims, rows: usize) -> Result<Self> {
        let qk_len = rows * d.key_heads * d.key_dim;
        let gate_len = rows * d.value_heads;
        // SAFETY: the kernels write every element of each output.
        unsafe {
            Ok(Self {
                q: dev.alloc::<T>(qk_len)?,
                k: dev.alloc::<T>(qk_len)?,
                v: dev.alloc::<T>(rows * d.value_heads * d.value_dim)?,
                g: dev.alloc::<f32>(gate_len)?,
                beta: dev.alloc::<f32>(gate_len)?,
            })
        }
    }

    /// q, k, v, g, beta: the kernels' arguments before the params.
    pub(crate) fn push<'a>(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.q)
            .arg(&self.k)
            .arg(&self.v)
            .arg(&self.g)
            .arg(&self.beta);
    }

    /// `[q, k, v, g, beta]` as `[B, S, Hk, Dk]` (q, k), `[B, S, Hv, Dv]`, `[B, S, Hv]`.
    pub(crate) fn into_tensors(
        self,
        dev: &CudaDevice,
        d: ConvPrepDims,
        (bn, s): (usize, usize),
    ) -> [Tensor; 5] {
        let qk_shape = (bn, s, d.key_heads, d.key_dim);
        [
            tensor(self.q, dev, qk_shape),
            tensor(self.k, dev, qk_shape),
            tensor(self.v, dev, (bn, s, d.value_heads, d.value_dim)),
            tensor(self.g, dev, (bn, s, d.value_heads)),
            tensor(self.beta, dev, (bn, s, d.value_heads)),
        ]
    }
}

/// The device and dtype of a call, checked against the kernels' coverage: both launchers'
/// entry.
pub(crate) fn checked_device(inputs: &Inputs, op: &str) -> Result<(CudaDevice, DType)> {
    let dev = cuda_device(inputs.conv_state, op)?;
    let dtype = inputs.qkv.dtype();
    ensure!(
        supports(&inputs.dims, dtype),
        "{op}: no CUDA kernel for {:?} in {dtype:?} (head dims multiples of 32 up to 256, 2 to 8 taps)",
        inputs.dims
    );
    Ok((dev, dtype))
}

/// The inputs both conv-front launches bind besides the state (the per-sequence launch's
/// `conv_state`, the slot launch's address table): each sequence's rows of qkv, b and a, and
/// the layer's taps, dt_bias and neg_a_exp, read-locked while their views are bound.
pub(crate) struct HeldInputs<'a> {
    rows: [Held<'a>; 3],
    layer: [Held<'a>; 3],
}

/// The device views of [`HeldInputs`], in the kernels' argument order.
pub(crate) struct InputViews<'a, T> {
    qkv: CudaView<'a, T>,
    b: CudaView<'a, T>,
    a: CudaView<'a, T>,
    taps: CudaView<'a, T>,
    dt_bias: CudaView<'a, f32>,
    neg_a_exp: CudaView<'a, f32>,
}

impl<'a> HeldInputs<'a> {
    pub(crate) fn new(inputs: &Inputs<'a>) -> Self {
        Self {
            rows: [inputs.qkv, inputs.b, inputs.a].map(Held::new),
            layer: [inputs.taps, inputs.dt_bias, inputs.neg_a_exp].map(Held::new),
        }
    }

    /// qkv, b and a may be views: their row layouts (in `inputs`) were checked by the caller.
    pub(crate) fn views<T: Element>(&self, inputs: &Inputs, op: &str) -> Result<InputViews<'_, T>> {
        let [qkv, b, a] = &self.rows;
        let [taps, dt_bias, neg_a_exp] = &self.layer;
        Ok(InputViews {
            qkv: qkv.rows(&inputs.qkv_rows, op)?,
            b: b.rows(&inputs.b_rows, op)?,
            a: a.rows(&inputs.a_rows, op)?,
            taps: taps.view(op)?,
            dt_bias: dt_bias.view(op)?,
            neg_a_exp: neg_a_exp.view(op)?,
        })
    }
}

impl<'a, T: Element> InputViews<'a, T> {
    /// qkv, b, a: the kernels' leading arguments (the state or its table follows).
    pub(crate) fn push_rows(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.qkv).arg(&self.b).arg(&self.a);
    }

    /// taps, dt_bias, neg_a_exp: the arguments after the state (the outputs follow).
    pub(crate) fn push_layer(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.taps).arg(&self.dt_bias).arg(&self.neg_a_exp);
    }
}
