//! Custom ops for qwen-gdn: the fused gated-delta recurrence of Gated DeltaNet layers, and
//! MLX affine-quantized matrices ([`affine`]).
//!
//! [`gated_delta_update`] is the single entry point. It dispatches on the device of the
//! state; the CPU implementation in [`cpu`] is the reference every faster path is tested
//! against.

pub mod affine;
pub mod affine_q8;
pub mod affine_tensor;
pub mod capability;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod launches;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;
pub mod simd;
pub mod threads;

use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};

/// Storage dtype of the GDN recurrent state. fp32 is the default: writing the state back in
/// bf16 every step is what made Qwen3.5 output incoherent elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateDtype {
    #[default]
    F32,
    Bf16,
}

/// The opt-in environment variable for a bf16 recurrent state (the name mlx-lm users know).
pub const STATE_BF16_ENV: &str = "MLX_LM_GDN_STATE_BF16";

impl StateDtype {
    /// bf16 only when `MLX_LM_GDN_STATE_BF16` is exactly `1`; anything else keeps fp32.
    pub fn from_env() -> Self {
        Self::from_env_value(std::env::var(STATE_BF16_ENV).ok().as_deref())
    }

    pub fn from_env_value(value: Option<&str>) -> Self {
        if value == Some("1") {
            Self::Bf16
        } else {
            Self::F32
        }
    }

    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
        }
    }
}

impl std::str::FromStr for StateDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "fp32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => bail!("invalid GDN state dtype `{other}` (expected f32 or bf16)"),
        }
    }
}

/// The read-only inputs of one call, as the device backends receive them.
pub(crate) struct Inputs<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    g: &'a Tensor,
    beta: &'a Tensor,
    mask: Option<&'a Tensor>,
}

/// Shapes of one gated-delta call, read off its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    pub batch: usize,
    pub steps: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

impl GdnDims {
    fn of(inputs: &Inputs, state: &Tensor) -> Result<Self> {
        let Inputs {
            q, k, v, g, beta, ..
        } = *inputs;
        let (batch, steps, key_heads, key_dim) = q.dims4()?;
        let (_, _, value_heads, value_dim) = v.dims4()?;
        let d = Self {
            batch,
            steps,
            key_heads,
            value_heads,
            key_dim,
            value_dim,
        };
        ensure!(
            k.dims() == q.dims(),
            "gated_delta_update: k {:?} must match q {:?}",
            k.dims(),
            q.dims()
        );
        ensure!(
            v.dims()[..2] == [batch, steps],
            "gated_delta_update: v {:?} does not match q {:?}",
            v.dims(),
            q.dims()
        );
        ensure!(
            value_heads % key_heads == 0,
            "gated_delta_update: {value_heads} value heads not a multiple of {key_heads} key heads"
        );
        for (name, t) in [("g", g), ("beta", beta)] {
            ensure!(
                t.dims() == [batch, steps, value_heads],
                "gated_delta_update: {name} {:?}, expected {:?}",
                t.dims(),
                [batch, steps, value_heads]
            );
        }
        ensure!(
            state.dims() == [batch, value_heads, value_dim, key_dim],
            "gated_delta_update: state {:?}, expected {:?}",
            state.dims(),
            [batch, value_heads, value_dim, key_dim]
        );
        Ok(d)
    }
}

/// Advances `state` `[B, Hv, Dv, Dk]` in place over `T` tokens and returns `y`
/// `[B, T, Hv, Dv]` in q's dtype.
///
/// Inputs: `q`, `k` `[B, T, Hk, Dk]` (already L2-normalised, q scaled by 1/√Dk), `v`
/// `[B, T, Hv, Dv]`, decay `g` and `beta` `[B, T, Hv]`. Value head `hv` uses key head
/// `hv / (Hv / Hk)`. Per token, in mlx-lm's order: `S ← g·S`; `kv = S·k`;
/// `δ = (v − kv)·β`; `S ← S + δ⊗k`; `y = S·q`. Arithmetic is f32; the state is read
/// once and written once per call in its own dtype (f32, or bf16 when opted in).
pub fn gated_delta_update(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
) -> Result<Tensor> {
    gated_delta_update_masked(q, k, v, g, beta, state, None)
}

/// As [`gated_delta_update`], with an optional `[B, T]` mask for padded batches: where the
/// mask is 0 the state is left untouched and `y` is 0.
pub fn gated_delta_update_masked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let inputs = Inputs {
        q,
        k,
        v,
        g,
        beta,
        mask,
    };
    let dims = GdnDims::of(&inputs, state)?;
    if let Some(m) = mask {
        ensure!(
            m.dims() == [dims.batch, dims.steps],
            "gated_delta_update: mask {:?}, expected {:?}",
            m.dims(),
            [dims.batch, dims.steps]
        );
    }
    launches::record(1);
    match state.device() {
        Device::Cpu => cpu::gated_delta_update(dims, &inputs, state),
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => metal::gated_delta_update(dims, &inputs, state),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::gated_delta_update(dims, &inputs, state),
        other => bail!("gated_delta_update: no kernel for device {other:?} yet"),
    }
}
