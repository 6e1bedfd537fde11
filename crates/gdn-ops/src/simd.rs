//! Hot CPU loops compiled three times: for the baseline target and, picked at run time, for
//! AVX2 + FMA and for AVX-512. The loops are written as plain eight-lane arithmetic that the compiler vectorises; the
//! second copy lets it use 256-bit registers and variable shifts without building the whole
//! binary for one CPU (llama.cpp's GGML_NATIVE, without its portability cost).

use std::sync::atomic::{AtomicU8, Ordering};

/// Defines `pub fn $name(..) -> $ret` that runs `$body` compiled with AVX-512 (F, BW, VL) or
/// else AVX2 and FMA when the CPU has them, else for the baseline target. The body must be
/// safe code; loops over 16 lanes fill one AVX-512 register or two AVX2 ones.
#[macro_export]
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) -> $ret {
                    portable($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) -> $ret {
                    portable($($arg),*)
                }
                let level = $crate::simd::level();
                if level == $crate::simd::Level::Avx512 {
                    // SAFETY: the CPU supports the features `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if level == $crate::simd::Level::Avx2 {
                    // SAFETY: the CPU supports the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable($($arg),*)
        }
    };
}

/// Whether this CPU runs the AVX-512 copies (checked once; cached by std).
#[inline]
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && has_avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the 8-bit-activation kernel may use AVX-512 VNNI (`vpdpbusd`): the CPU has it and
/// the level cap ([`cap_level`]) does not stop below AVX-512. The CPU is asked once per
/// process (the kernel asks for every weight row).
pub fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    level() == Level::Avx512
        && *VNNI.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        })
}

/// Whether this CPU runs the AVX2 + FMA copies (checked once; cached by std).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Which compiled copy the hot loops run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Portable,
    Avx2,
    Avx512,
}

/// The cap [`cap_level`] set, as its `Level as u8` (no cap: `Avx512`).
static CAP: AtomicU8 = AtomicU8::new(Level::Avx512 as u8);

/// Caps the level below what the CPU offers (the model's `QWEN_GDN_CPU_LEVEL`): how the tests
/// run every copy on one machine. Process-wide, because the kernels that ask are leaves deep
/// under every op and the copies are chosen per CPU, not per model; set it before the first
/// product (the model's load does) so that every product of a run takes the same copy.
pub fn cap_level(cap: Level) {
    CAP.store(cap as u8, Ordering::Relaxed);
}

/// The best copy this CPU runs, capped by [`cap_level`].
pub fn level() -> Level {
    static DETECTED: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    let detected = *DETECTED.get_or_init(|| {
        if has_avx512() {
            Level::Avx512
        } else if has_avx2_fma() {
            Level::Avx2
        } else {
            Level::Portable
        }
    });
    let cap = match CAP.load(Ordering::Relaxed) {
        0 => Level::Portable,
        1 => Level::Avx2,
        _ => Level::Avx512,
    };
    detected.min(cap)
}
