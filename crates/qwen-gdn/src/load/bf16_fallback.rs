//! bf16 where the device has none: Metal before MSL 3.1 (macOS 13) compiles neither our
//! bfloat kernels nor candle's, so a bf16 run there computes in f16 (activations) and keeps
//! an f32 recurrent state, with a notice, instead of failing at its first kernel.

use candle_core::DType;
use qwen_gdn_model::StateDtype;

/// The activation and state dtypes to load with, and the notice to print when they changed.
pub fn resolve(
    dtype: DType,
    state: StateDtype,
    device_has_bf16: bool,
) -> (DType, StateDtype, Option<String>) {
    if device_has_bf16 {
        return (dtype, state, None);
    }
    let mut changed = vec![];
    let dtype = if dtype == DType::BF16 {
        changed.push("activations in f16");
        DType::F16
    } else {
        dtype
    };
    let state = if state == StateDtype::Bf16 {
        changed.push("the GDN state in f32");
        StateDtype::F32
    } else {
        state
    };
    let notice = (!changed.is_empty()).then(|| {
        format!(
            "note: this GPU's Metal has no bf16 (it needs macOS 14); computing with {}",
            changed.join(" and ")
        )
    });
    (dtype, state, notice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_becomes_f16_activations_and_f32_state_with_a_notice() {
        let (d, s, note) = resolve(DType::BF16, StateDtype::Bf16, false);
        assert_eq!((d, s), (DType::F16, StateDtype::F32));
        assert_eq!(
            note.unwrap(),
            "note: this GPU's Metal has no bf16 (it needs macOS 14); computing with \
             activations in f16 and the GDN state in f32"
        );
        let (d, s, note) = resolve(DType::BF16, StateDtype::F32, false);
        assert_eq!((d, s), (DType::F16, StateDtype::F32));
        assert!(note.unwrap().ends_with("computing with activations in f16"));
    }

    #[test]
    fn nothing_changes_with_bf16_or_without_bf16_asked() {
        assert_eq!(
            resolve(DType::BF16, StateDtype::Bf16, true),
            (DType::BF16, StateDtype::Bf16, None)
        );
        assert_eq!(
            resolve(DType::F32, StateDtype::F32, false),
            (DType::F32, StateDtype::F32, None)
        );
    }
}
