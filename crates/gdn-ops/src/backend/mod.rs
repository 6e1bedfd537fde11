//! What every op's backends share: the kernel-name tag of a dtype, row layouts of strided
//! views, the CPU twins' f32 values and rounding ([`round_to`]), and per backend the
//! loading of shipped kernel sources, buffer views, output wrapping and the launch itself
//! (which is where launches are counted, see [`crate::launches`]).

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;
mod rounding;

use anyhow::{bail, ensure, Result};
use candle_core::{DType, Tensor};

pub(crate) use rounding::{f32_values, round_to};

/// An op's dispatch on `$device`: `$f($args)` of its backend module in scope, `cpu::$f` (the
/// CPU twin, counted as the one launch a GPU makes, see [`crate::launches::cpu_twin`]), or
/// `metal::$f` or `cuda::$f` where this build has that backend, else "`$op`: no kernel for
/// device …". Every op's backends take the same arguments.
macro_rules! on_device {
    ($device:expr, $op:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $device {
            candle_core::Device::Cpu => $crate::launches::cpu_twin(|| cpu::$f($($arg),*)),
            #[cfg(any(feature = "metal", target_os = "macos"))]
            candle_core::Device::Metal(_) => metal::$f($($arg),*),
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(_) => cuda::$f($($arg),*),
            #[allow(unreachable_patterns)]
            other => anyhow::bail!("{}: no kernel for device {other:?}", $op),
        }
    };
}
pub(crate) use on_device;

/// The kernel-name suffix of a float dtype (`<kernel>_<tag>` instantiations in `kernels/`).
pub fn dtype_tag(dtype: DType, op: &str) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("{op}: no kernel for {other:?}"),
    })
}

/// The name of `kernel`'s instantiation for `dtypes`, one tag each in order
/// (`<kernel>_<tag>_<tag>`, as `kernels/` names its entry points).
pub fn kernel_instance(kernel: &str, dtypes: &[DType], op: &str) -> Result<String> {
    let mut name = kernel.to_string();
    for &dtype in dtypes {
        name.push('_');
        name.push_str(dtype_tag(dtype, op)?);
    }
    Ok(name)
}

/// Fails unless every tensor of `others` is on `anchor`'s device: "`op`: `name` is on another
/// device than `anchor_name`".
pub fn ensure_same_device(
    op: &str,
    anchor: &Tensor,
    anchor_name: &str,
    others: &[(&str, &Tensor)],
) -> Result<()> {
    for (name, t) in others {
        ensure!(
            t.device().same_device(anchor.device()),
            "{op}: {name} is on another device than {anchor_name}"
        );
    }
    Ok(())
}

/// Where the rows of a view lie in its storage, for kernels that read rows at a stride (a
/// slice of a wider projection output, say) instead of copying them first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayout {
    /// Element offset of the first value.
    pub start: usize,
    /// Element stride of each leading dim (0 for a dim of size 1).
    pub strides: Vec<usize>,
    /// Elements from `start` to just past the last value the rows hold.
    pub span: usize,
}

/// Reads `t` as `lead` dims of rows of `len` contiguous values: its dims must be `lead`
/// followed by dims whose product is `len`, laid out contiguously (unit stride innermost),
/// while the leading dims may have any stride. `what` names the tensor in errors.
pub fn row_layout(t: &Tensor, lead: &[usize], len: usize, what: &str) -> Result<RowLayout> {
    let (dims, strides) = (t.dims(), t.stride());
    let inner = dims.get(lead.len()..).unwrap_or(&[]);
    ensure!(
        dims.len() > lead.len()
            && dims[..lead.len()] == *lead
            && inner.iter().product::<usize>() == len,
        "{what} {dims:?}: expected dims {lead:?} followed by {len} values"
    );
    let mut expected = 1;
    for (&d, &s) in inner.iter().zip(&strides[lead.len()..]).rev() {
        ensure!(
            d == 1 || s == expected,
            "{what}: each row of {len} values must be contiguous (strides {strides:?})"
        );
        expected *= d;
    }
    let strides: Vec<usize> = lead
        .iter()
        .zip(strides)
        .map(|(&d, &s)| if d == 1 { 0 } else { s })
        .collect();
    let empty = lead.contains(&0) || len == 0;
    let span = if empty {
        0
    } else {
        lead.iter()
            .zip(&strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum::<usize>()
            + len
    };
    Ok(RowLayout {
        start: t.layout().start_offset(),
        strides,
        span,
    })
}
