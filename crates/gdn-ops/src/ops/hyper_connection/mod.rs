//! The elementwise and per-stream parts of a `qwen4_exp` hyper-connection in a decode step
//! (crates/qwen-gdn-model/src/families/qwen4_exp/hyper_connection.rs holds the composed
//! maths these replace), in two kernels; the three products between them stay the affine
//! kernels.
//!
//! The residual is `S` streams of `H` per token, `hs` `[N, S·H]` in the activation dtype
//! InT (f32, f16 or bf16). Per token n, stream s and column j, in f32, rounded to InT where
//! the composed ops store:
//!
//! [`hc_inject_norm`]: a block's output `y` `[N, H]` injected into every stream with its gate
//! from the logits `g` `[N, S]` (the injection product's output), then the grouped RMSNorm
//! of the next hyper-connection with its weight `[S, H]` (f32, `1 + w`):
//! - `w = InT(2 · InT(sigmoid(InT(g[n, s] / S))))`;
//! - `sum = InT(f32(hs) + InT(w · f32(y[n, j])))` (without an injection `sum` is `hs` itself,
//!   returned as is);
//! - `normed = InT(sum · rsqrt(mean_j sum² + eps) · weight[s, j])`, the mean over the
//!   stream's `H` values (without a norm weight, nothing).
//!
//! It replaces the composed injection (5 launches) and the grouped norm (8) by one launch.
//! [`hc_inject_slots_norm`] injects a MoE block's output from its slots instead: `y[n, j] =
//! InT(Σ_k weights[n, k] · f32(down[n, k, j]))` (slots in order, f32 weights), the sum
//! `moe_combine` would have launched for it.
//!
//! [`hc_mix`]: the streams mixed into the block's input, from the up product's logits `u`
//! `[N, S·H]` and the normed streams `n` `[N, S·H]`:
//! - `x[n, j] = InT((1/S) · Σ_s InT(InT(sigmoid(u[n, s, j])) · f32(n[n, s, j])))` (streams in
//!   order), `[N, H]`.
//!
//! It replaces the sigmoid, the product and the mean over streams (4 launches) by one.
//!
//! [`hc_act`]: the low-rank mixer's activation on the down product's output `d` `[N, R]`:
//! - `a = InT(silu(InT(d / S)))`, `silu(t) = t / (1 + e^{-t})`.
//!
//! It replaces the scale and the silu (2 launches) by one.
//!
//! [`hc_up_mix`]: `hc_act`, the up product and `hc_mix` in one launch, from the down
//! product's output `d` `[N, R]`, the up matrix `W` (MLX affine, `[S·H, R]`, 2, 4 or 8 bits)
//! and the normed streams `n` `[N, S·H]`:
//! - `a = InT(silu(InT(d / S)))` (as `hc_act`);
//! - `u[n, s, j] = InT(Σ_k W[s·H + j, k] · a[n, k])`, f32 products and sums (as the affine
//!   product rounds it);
//! - `x` from `u` and `n` as `hc_mix`.
//!
//! It replaces `hc_act`, the up product and `hc_mix` (3 launches) by one: every block
//! recomputes the `R` activations of its token (R = 320 at the release: a few hundred
//! values against the `S` weight rows of `R` each it reads per output).
//!
//! Kernels: `kernels/hyper_connection.{metal,cu}` (`hc_inject_norm_<t>`: one block per
//! stream row of [`row_threads`] threads holding [`PER_THREAD`] values each, on CUDA at
//! decode a row over a cluster of [`INJECT_CLUSTER_BLOCKS`] blocks,
//! `hc_inject_norm_cluster_<t>` ([`inject_uses_cluster`]); `hc_mix_<t>`:
//! [`MIX_THREADS`] threads a block, one output value each; `hc_up_mix_<t>_<s>`:
//! [`UP_MIX_WARPS`] warps a block, one output value each, the token's activations in shared
//! memory); [`cpu`] is the twin both match.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use super::affine::AffineTensor;
use crate::backend::on_device;
use crate::profile::{self, tensor_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// The injection/norm kernel holds a stream row as `add_rms_norm` holds a row: the widest
/// stream it takes, the values of a row each thread holds (`kPer` in both kernels), and the
/// threads of a row's block (whole simdgroups, a row's loads in flight together).
pub use super::add_rms_norm::{row_threads, MAX_COLS, PER_THREAD};

/// Threads of `hc_inject_norm`'s block for `rows` stream rows of `cols` values on a GPU of
/// `sms` SMs. A decode step has N·S = 4 stream rows: 4 blocks, 4 busy SMs, each thread of
/// [`row_threads`] walking [`PER_THREAD`] columns (with a MoE block's K = 11 slots, 88 loads a
/// thread) — 10.9 µs a call on the H200 for ~70 KB a row. With fewer rows than SMs a row's
/// block takes a thread a column up to 1 024 (the kernel guards every column past `cols`): at
/// H = 2 560 three columns a thread, a third of the serial loads, three times the warps. The
/// CUDA kernel walks only the columns a thread holds (`ceil(cols / threads)`: 1, 2, 3, 4 or
/// 8, each unrolled), not [`PER_THREAD`] predicated slots, and sums a MoE block's slots 4 at
/// a time across them (ncu, fifteenth session: the 4 SMs were issue-bound, ~640 instructions
/// a warp).
pub fn inject_row_threads(rows: usize, cols: usize, sms: usize) -> usize {
    if rows >= sms {
        return row_threads(cols);
    }
    (cols.div_ceil(32) * 32).clamp(row_threads(cols), 1024)
}

/// Which kernel takes an injection/norm call ([`hc_inject_norm_with`]). Only CUDA has a choice;
/// the other backends run their one kernel whatever is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InjectKernel {
    /// On CUDA, a stream row over a cluster of blocks where [`inject_uses_cluster`] says so,
    /// else one block a row.
    #[default]
    Auto,
    /// One block a stream row always: the cluster kernel's reference, and the A/B switch.
    OneBlock,
}

/// Blocks of a stream row's cluster in `hc_inject_norm_cluster_*` (`kClusterBlocks` in
/// kernels/hyper_connection.cu; 8, the portable cluster size's most).
pub const INJECT_CLUSTER_BLOCKS: usize = 8;

/// The narrowest stream the cluster form takes: 128 columns a block of the cluster. Below, one
/// block's reduction is short and the cluster's barriers would be most of the call.
pub const INJECT_CLUSTER_MIN_COLS: usize = 128 * INJECT_CLUSTER_BLOCKS;

/// Whether a CUDA call of `rows` stream rows of `cols` on a GPU of `sms` SMs runs
/// `hc_inject_norm_cluster_*` (each row over [`INJECT_CLUSTER_BLOCKS`] blocks of a cluster,
/// sm_90): where every block of every cluster has an SM of its own and a row is at least
/// [`INJECT_CLUSTER_MIN_COLS`] wide, unless `kernel` asks for one block. Why: a decode step's 4
/// stream rows on 4 of the H200's 132 SMs are one load → block reduce → store latency chain
/// each (6.4–6.8 µs a call under Nsight Compute, 9.0 with a MoE block's 11 slots); over 32
/// SMs each block holds a thread's worth of a row (docs/perf-notes-gpu.md, issue 25).
pub fn inject_uses_cluster(rows: usize, cols: usize, sms: usize, kernel: InjectKernel) -> bool {
    kernel == InjectKernel::Auto
        && rows * INJECT_CLUSTER_BLOCKS <= sms
        && (INJECT_CLUSTER_MIN_COLS..=MAX_COLS).contains(&cols)
}

/// Threads of a block of `hc_inject_norm_cluster_*` for a row of `cols`: a thread a column of
/// the block's `ceil(cols / INJECT_CLUSTER_BLOCKS)` (whole warps; at most 1 024 since `cols`
/// is at most [`MAX_COLS`]), as [`inject_row_threads`] takes them for few rows — at the
/// release 320 threads of one column each.
pub fn inject_cluster_threads(cols: usize) -> usize {
    (cols.div_ceil(INJECT_CLUSTER_BLOCKS).div_ceil(32) * 32).clamp(32, 1024)
}

/// Threads of a block of the elementwise kernels (`hc_act`, `hc_mix`), one value each.
pub const MIX_THREADS: usize = 256;

/// Warps (simdgroups) of a `hc_up_mix` block, one output value `x[n, j]` each, the `S`
/// streams' dots side by side in a warp (32 / S lanes a stream, S rounded up to a power of
/// two). 4: at the release (H = 2 560) 640 blocks of 128 threads, all resident at once on the
/// H200's 132 SMs at the kernel's 78 registers a thread (6 blocks an SM), where 8 made 320
/// blocks on fewer SMs.
pub const UP_MIX_WARPS: usize = 4;

/// The widest low-rank activation `hc_up_mix` holds in a block's shared memory (32 KB of f32).
pub const MAX_RANK: usize = 8192;

/// `HcUpMixParams` of kernels/params/hyper_connection.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HcUpMixParams {
    pub tokens: u32,
    pub streams: u32,
    pub cols: u32,
    pub rank: u32,
    pub bits: u32,
    pub group_size: u32,
}

/// `HcInjectNormParams` of kernels/params/hyper_connection.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HcInjectNormParams {
    pub tokens: u32,
    pub streams: u32,
    pub cols: u32,
    pub has_inject: u32,
    pub has_norm: u32,
    pub eps: f32,
    pub slots: u32,
}

/// `HcActParams` of kernels/params/hyper_connection.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HcActParams {
    pub len: u32,
    pub streams: u32,
}

/// `HcMixParams` of kernels/params/hyper_connection.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HcMixParams {
    pub tokens: u32,
    pub streams: u32,
    pub cols: u32,
}

/// The inputs of one [`hc_inject_norm`] call after the checks (contiguous).
pub(crate) struct InjectInputs {
    pub hs: Tensor,
    /// `(y [N, H], g [N, S])`, or with slot weights `(down [N, K, H], g [N, S])`.
    pub inject: Option<(Tensor, Tensor)>,
    /// `[N, K]` f32: `y` is the weighted sum of `down`'s K slots.
    pub slot_weights: Option<Tensor>,
    /// `[S, H]` f32.
    pub weight: Option<Tensor>,
    pub params: HcInjectNormParams,
    /// The kernel asked for: only the CUDA backend has a choice to read it for.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub kernel: InjectKernel,
}

/// The inputs of one [`hc_mix`] call after the checks (contiguous).
pub(crate) struct MixInputs {
    pub up: Tensor,
    pub normed: Tensor,
    pub params: HcMixParams,
}

/// The inputs of one [`hc_act`] call after the checks (contiguous).
pub(crate) struct ActInputs {
    pub d: Tensor,
    pub params: HcActParams,
}

/// The inputs of one [`hc_up_mix`] call after the checks (contiguous).
pub(crate) struct UpMixInputs<'a> {
    /// `[N, R]`.
    pub d: Tensor,
    pub up: &'a AffineTensor,
    /// `[N, S·H]`.
    pub normed: Tensor,
    pub params: HcUpMixParams,
}

/// Whether `hc_up_mix` covers the up matrix `up` of a hyper-connection of `streams` streams
/// of `hidden` in `dtype`: one `[S·H, R]` matrix of whole values per packed word (2, 4, 8
/// bits) whose groups span whole words, R at most [`MAX_RANK`], scales and biases of one
/// float type. The model keeps `hc_act`, the product and `hc_mix` otherwise.
pub fn supports_up_mix(up: &AffineTensor, streams: usize, hidden: usize, dtype: DType) -> bool {
    let floats = |t: DType| matches!(t, DType::F32 | DType::F16 | DType::BF16);
    supports(streams, hidden, dtype)
        && up.experts == 1
        && up.rows == streams * hidden
        && (1..=MAX_RANK).contains(&up.cols)
        && matches!(up.bits, 2 | 4 | 8)
        && up.group_size.is_multiple_of(32 / up.bits)
        && up.cols.is_multiple_of(up.group_size)
        && floats(up.scales.dtype())
        && up.scales.dtype() == up.biases.dtype()
}

/// Whether the kernels cover `streams` streams of `hidden` in `dtype`; the model keeps the
/// composed ops otherwise.
pub fn supports(streams: usize, hidden: usize, dtype: DType) -> bool {
    streams >= 1
        && (1..=MAX_COLS).contains(&hidden)
        && (streams * hidden) <= u32::MAX as usize
        && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// `(tokens, cols)` of `t` (the argument `what` of `op`), `[N, S·H]` in `streams` streams,
/// refused where the kernels do not cover it.
fn streams_shape(op: &str, what: &str, t: &Tensor, streams: usize) -> Result<(usize, usize)> {
    let (tokens, width) = t
        .dims2()
        .map_err(|_| anyhow::anyhow!("{op}: {what} {:?} must be [N, S·H]", t.dims()))?;
    ensure!(
        streams >= 1 && width % streams == 0,
        "{op}: {width} features are not {streams} streams"
    );
    let (cols, dtype) = (width / streams, t.dtype());
    ensure!(
        supports(streams, cols, dtype) && tokens >= 1,
        "{op}: no kernel for {tokens} tokens of {streams} streams of {cols} {dtype:?} values \
         (f32/f16/bf16, 1..={MAX_COLS} a stream)"
    );
    Ok((tokens, cols))
}

/// `(sum, normed)`: `hs` `[N, S·H]` with `inject = (y [N, H], g [N, S])` injected, and its
/// grouped RMSNorm when `norm = (weight [S, H] f32, eps)` is given (see the module doc).
/// Without an injection `sum` is `hs` itself.
pub fn hc_inject_norm(
    hs: &Tensor,
    inject: Option<(&Tensor, &Tensor)>,
    norm: Option<(&Tensor, f32)>,
    streams: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    hc_inject_norm_with(hs, inject, None, norm, streams, InjectKernel::Auto)
}

/// [`hc_inject_norm`] of a MoE block's output given by its slots: `down` `[N, K, H]` and
/// their f32 weights `weights` `[N, K]` (see the module doc), gate logits `g` `[N, S]`.
pub fn hc_inject_slots_norm(
    hs: &Tensor,
    (down, weights, g): (&Tensor, &Tensor, &Tensor),
    norm: Option<(&Tensor, f32)>,
    streams: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    hc_inject_norm_with(
        hs,
        Some((down, g)),
        Some(weights),
        norm,
        streams,
        InjectKernel::Auto,
    )
}

/// Both injections on the kernel `kernel` asks for (CUDA; the same maths on every backend):
/// `inject = (y, g)` with `y` `[N, H]` alone, or `[N, K, H]` with `slot_weights` `[N, K]`
/// ([`hc_inject_norm`], [`hc_inject_slots_norm`]).
pub fn hc_inject_norm_with(
    hs: &Tensor,
    inject: Option<(&Tensor, &Tensor)>,
    slot_weights: Option<&Tensor>,
    norm: Option<(&Tensor, f32)>,
    streams: usize,
    kernel: InjectKernel,
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "hc_inject_norm";
    let (tokens, cols) = streams_shape(OP, "hs", hs, streams)?;
    let dtype = hs.dtype();
    ensure!(
        inject.is_some() || norm.is_some(),
        "{OP}: neither an injection nor a norm to compute"
    );
    let slots = match slot_weights {
        Some(w) => {
            let k = w.dim(1).unwrap_or(0);
            ensure!(
                w.dims() == [tokens, k] && k >= 1 && w.dtype() == DType::F32,
                "{OP}: slot weights {:?} {:?} must be [{tokens}, K] f32",
                w.dims(),
                w.dtype()
            );
            k
        }
        None => 0,
    };
    if let Some((y, g)) = inject {
        let want: &[usize] = if slots == 0 {
            &[tokens, cols]
        } else {
            &[tokens, slots, cols]
        };
        ensure!(
            y.dims() == want && y.dtype() == dtype,
            "{OP}: y {:?} {:?} must be {want:?} {dtype:?}",
            y.dims(),
            y.dtype()
        );
        ensure!(
            g.dims() == [tokens, streams] && g.dtype() == dtype,
            "{OP}: gate logits {:?} {:?} must be [{tokens}, {streams}] {dtype:?}",
            g.dims(),
            g.dtype()
        );
    }
    if let Some((w, eps)) = norm {
        ensure!(
            w.dims() == [streams, cols] && w.dtype() == DType::F32,
            "{OP}: norm weight {:?} {:?} must be [{streams}, {cols}] f32",
            w.dims(),
            w.dtype()
        );
        ensure!(
            eps.is_finite() && eps >= 0.0,
            "{OP}: eps must be finite and non-negative"
        );
    }
    let others = inject
        .into_iter()
        .flat_map(|(y, g)| [y, g])
        .chain(norm.map(|n| n.0))
        .chain(slot_weights);
    for t in others {
        ensure!(
            t.device().same_device(hs.device()),
            "{OP}: inputs on different devices"
        );
    }
    let inputs = InjectInputs {
        hs: hs.contiguous()?,
        inject: inject
            .map(|(y, g)| -> Result<_> { Ok((y.contiguous()?, g.contiguous()?)) })
            .transpose()?,
        weight: norm.map(|n| n.0.contiguous()).transpose()?,
        slot_weights: slot_weights.map(|w| w.contiguous()).transpose()?,
        params: HcInjectNormParams {
            tokens: tokens as u32,
            streams: streams as u32,
            cols: cols as u32,
            has_inject: inject.is_some() as u32,
            has_norm: norm.is_some() as u32,
            eps: norm.map_or(0.0, |n| n.1),
            slots: slots as u32,
        },
        kernel,
    };
    let device = hs.device();
    let (sum, normed): (Option<Tensor>, Option<Tensor>) = profile::kernel(
        OP,
        device,
        || Ok(inject_traffic(&inputs)),
        || on_device!(device, OP, hc_inject_norm(&inputs)),
    )?;
    Ok((sum.unwrap_or_else(|| hs.clone()), normed))
}

/// `x` `[N, H]`: the streams mixed into the block's input from the up product's logits `up`
/// and the normed streams `normed`, both `[N, S·H]` (see the module doc).
pub fn hc_mix(up: &Tensor, normed: &Tensor, streams: usize) -> Result<Tensor> {
    const OP: &str = "hc_mix";
    let (tokens, cols) = streams_shape(OP, "up", up, streams)?;
    let (width, dtype) = (streams * cols, up.dtype());
    ensure!(
        normed.dims() == up.dims() && normed.dtype() == dtype,
        "{OP}: normed {:?} {:?} must be {:?} {dtype:?}",
        normed.dims(),
        normed.dtype(),
        up.dims()
    );
    ensure!(
        normed.device().same_device(up.device()),
        "{OP}: inputs on different devices"
    );
    ensure!(
        u32::try_from(tokens * width).is_ok(),
        "{OP}: {tokens} tokens of {width} exceed u32"
    );
    let inputs = MixInputs {
        up: up.contiguous()?,
        normed: normed.contiguous()?,
        params: HcMixParams {
            tokens: tokens as u32,
            streams: streams as u32,
            cols: cols as u32,
        },
    };
    let device = up.device();
    profile::kernel(
        OP,
        device,
        || Ok(mix_traffic(&inputs)),
        || on_device!(device, OP, hc_mix(&inputs)),
    )
}

/// `silu(d / S)`, shaped and typed as `d` (the down product's output `[N, R]`; see the module
/// doc).
pub fn hc_act(d: &Tensor, streams: usize) -> Result<Tensor> {
    const OP: &str = "hc_act";
    let dtype = d.dtype();
    ensure!(
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
        "{OP}: no kernel for {dtype:?} (f32/f16/bf16)"
    );
    ensure!(streams >= 1, "{OP}: no streams");
    let len = d.elem_count();
    ensure!(
        len >= 1 && u32::try_from(len).is_ok() && u32::try_from(streams).is_ok(),
        "{OP}: {len} values of {streams} streams are outside the kernel (1..=u32::MAX)"
    );
    let inputs = ActInputs {
        d: d.contiguous()?,
        params: HcActParams {
            len: len as u32,
            streams: streams as u32,
        },
    };
    let device = d.device();
    let a = profile::kernel(
        OP,
        device,
        || Ok(Traffic::new().read_all(&inputs.d).write_all(&inputs.d)),
        || on_device!(device, OP, hc_act(&inputs)),
    )?;
    Ok(a.reshape(d.dims())?)
}

/// `x` `[N, H]`: `hc_act` of the down product's output `d` `[N, R]`, its product with the
/// up matrix `up` (`[S·H, R]`) and `hc_mix` of that with the normed streams `normed`
/// `[N, S·H]`, in one launch (see the module doc); refused where [`supports_up_mix`] is not.
pub fn hc_up_mix(d: &Tensor, up: &AffineTensor, normed: &Tensor, streams: usize) -> Result<Tensor> {
    const OP: &str = "hc_up_mix";
    let (tokens, cols) = streams_shape(OP, "normed", normed, streams)?;
    let dtype = normed.dtype();
    ensure!(
        supports_up_mix(up, streams, cols, dtype),
        "{OP}: no kernel for a {}-bit group-{} up matrix [{}, {}] ({:?} scales) of {streams}          streams of {cols} (2/4/8 bits, groups of whole words, 1..={MAX_RANK} columns)",
        up.bits,
        up.group_size,
        up.rows,
        up.cols,
        up.scales.dtype()
    );
    ensure!(
        d.dims() == [tokens, up.cols] && d.dtype() == dtype,
        "{OP}: d {:?} {:?} must be [{tokens}, {}] {dtype:?}",
        d.dims(),
        d.dtype(),
        up.cols
    );
    for t in [d, &up.packed] {
        ensure!(
            t.device().same_device(normed.device()),
            "{OP}: inputs on different devices"
        );
    }
    let inputs = UpMixInputs {
        d: d.contiguous()?,
        up,
        normed: normed.contiguous()?,
        params: HcUpMixParams {
            tokens: tokens as u32,
            streams: streams as u32,
            cols: cols as u32,
            rank: up.cols as u32,
            bits: up.bits as u32,
            group_size: up.group_size as u32,
        },
    };
    let device = normed.device();
    profile::kernel(
        OP,
        device,
        || {
            Ok(Traffic::new()
                .read(tensor_bytes(&inputs.d) + tensor_bytes(&inputs.normed) + up.bytes())
                .write(tensor_bytes(&inputs.normed) / streams))
        },
        || on_device!(device, OP, hc_up_mix(&inputs)),
    )
}

/// Bytes moved (the decode profile): the streams read, with an injection `y` and the gate
/// logits read and the sum written, with a norm its weight read and the normed streams
/// written.
fn inject_traffic(inputs: &InjectInputs) -> Traffic {
    let rows = tensor_bytes(&inputs.hs);
    let mut t = Traffic::new().read(rows);
    if let Some((y, g)) = &inputs.inject {
        t = t.read(tensor_bytes(y) + tensor_bytes(g)).write(rows);
    }
    if let Some(w) = &inputs.slot_weights {
        t = t.read(tensor_bytes(w));
    }
    if let Some(w) = &inputs.weight {
        t = t.read(tensor_bytes(w)).write(rows);
    }
    t
}

/// Bytes moved (the decode profile): both `[N, S·H]` inputs read, `[N, H]` written.
fn mix_traffic(inputs: &MixInputs) -> Traffic {
    let out = tensor_bytes(&inputs.up) / inputs.params.streams as usize;
    Traffic::new()
        .read(tensor_bytes(&inputs.up) + tensor_bytes(&inputs.normed))
        .write(out)
}

#[cfg(test)]
mod geometry_tests {
    use super::*;

    #[test]
    fn few_stream_rows_take_a_thread_a_column() {
        // Release decode: 4 stream rows of 2 560 → 1 024 threads (3 columns each), not 320.
        assert_eq!(row_threads(2560), 320);
        assert_eq!(inject_row_threads(4, 2560, 132), 1024);
        // The tiny fixture's 64 columns: a thread each.
        assert_eq!(inject_row_threads(4, 64, 132), 64);
        // H = 8 192 needs all 1 024 threads either way.
        assert_eq!(inject_row_threads(4, 8192, 132), 1024);
        // Prefill (many rows): PER_THREAD columns a thread, as before.
        assert_eq!(inject_row_threads(512 * 4, 2560, 132), 320);
    }

    #[test]
    fn decode_stream_rows_take_a_cluster_each() {
        let auto = InjectKernel::Auto;
        // Release decode: 4 rows of 2 560 over 32 of the H200's SMs, 320 threads a block.
        assert!(inject_uses_cluster(4, 2560, 132, auto));
        assert_eq!(inject_cluster_threads(2560), 320);
        // Asked for one block: the reference and the A/B switch.
        assert!(!inject_uses_cluster(4, 2560, 132, InjectKernel::OneBlock));
        // 16 rows fill 128 SMs; 17 would not fit one wave.
        assert!(inject_uses_cluster(16, 2560, 132, auto));
        assert!(!inject_uses_cluster(17, 2560, 132, auto));
        // A GPU of fewer SMs than a cluster's blocks a row.
        assert!(!inject_uses_cluster(4, 2560, 24, auto));
        // Narrow streams (the tiny fixture's 64) keep one block.
        assert!(!inject_uses_cluster(4, 64, 132, auto));
        assert!(!inject_uses_cluster(
            4,
            INJECT_CLUSTER_MIN_COLS - 1,
            132,
            auto
        ));
        assert!(inject_uses_cluster(4, INJECT_CLUSTER_MIN_COLS, 132, auto));
        // The widest stream: 1 024 columns a block, a thread each.
        assert!(inject_uses_cluster(2, MAX_COLS, 132, auto));
        assert_eq!(inject_cluster_threads(MAX_COLS), 1024);
        // A block's share not whole warps: 1 100 → 138 columns, 160 threads.
        assert_eq!(inject_cluster_threads(1100), 160);
    }
}
