//! The CPU instruction-set levels and the one choice of level per process.
//!
//! A [`Level`] names a set of CPU features that the hot loops have a compiled copy for:
//! portable, AVX2 (+ FMA), AVX2 with AVX-VNNI, AVX-512 (F, BW, VL), AVX-512 VNNI on x86-64;
//! NEON, NEON with dotprod (`sdot`), NEON with i8mm (`smmla`) on aarch64. The best level the
//! CPU has is detected once; the model's `QWEN_GDN_CPU_LEVEL` (read once, in its options) pins
//! another through [`select_level`], which refuses a level the CPU lacks, naming the missing
//! feature, so that no pin can end in an illegal instruction.
//!
//! Kernels ask [`level`] and map it to their copies: the float loops of [`multiversion!`]
//! have three (portable, AVX2, AVX-512: [`Level::float_copy`]), the 8-bit-activation kernels
//! one per level.

use std::sync::atomic::{AtomicU8, Ordering};

/// Defines `pub fn $name(..) -> $ret` that runs `$body` compiled for the selected level's
/// float copy ([`Level::float_copy`]): AVX-512 (F, BW, VL), AVX2 and FMA, or the baseline
/// target (on aarch64 the baseline has NEON). The body must be safe code; loops over 16 lanes
/// fill one AVX-512 register or two AVX2 ones.
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
                match $crate::simd::level().float_copy() {
                    // SAFETY: the selected level's CPU features include the copy's.
                    $crate::simd::FloatCopy::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::simd::FloatCopy::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::simd::FloatCopy::Portable => {}
                }
            }
            portable($($arg),*)
        }
    };
}

/// An instruction-set level the CPU kernels have a copy for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// The baseline target's code (x86-64's SSE2; aarch64's baseline is [`Level::Neon`]).
    Portable,
    /// AVX2 and FMA: 256-bit registers, `vpmaddubsw` for the 8-bit dots.
    Avx2,
    /// AVX2 with AVX-VNNI (VEX `vpdpbusd`: Alder Lake and later, Zen 5).
    Avx2Vnni,
    /// AVX-512 F, BW and VL (with AVX2 and FMA).
    Avx512,
    /// AVX-512 with VNNI (512-bit `vpdpbusd`).
    Avx512Vnni,
    /// aarch64's baseline NEON.
    Neon,
    /// NEON with the dot-product extension (`sdot`).
    NeonDotprod,
    /// NEON with dotprod and the 8-bit matrix multiply (`smmla`).
    NeonI8mm,
}

/// Which compiled copy of the float loops ([`multiversion!`]) a level runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatCopy {
    Portable,
    Avx2,
    Avx512,
}

impl Level {
    /// Every level, in the order of [`Level::name`]'s table.
    pub const ALL: [Level; 8] = [
        Level::Portable,
        Level::Avx2,
        Level::Avx2Vnni,
        Level::Avx512,
        Level::Avx512Vnni,
        Level::Neon,
        Level::NeonDotprod,
        Level::NeonI8mm,
    ];

    /// The name `QWEN_GDN_CPU_LEVEL` takes.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx2Vnni => "avx2-vnni",
            Level::Avx512 => "avx512",
            Level::Avx512Vnni => "avx512-vnni",
            Level::Neon => "neon",
            Level::NeonDotprod => "neon-dotprod",
            Level::NeonI8mm => "neon-i8mm",
        }
    }

    /// The level named `name` ([`Level::name`]).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The architecture whose CPUs can have the level.
    pub fn arch(self) -> &'static str {
        match self {
            Level::Portable => ARCH,
            Level::Avx2 | Level::Avx2Vnni | Level::Avx512 | Level::Avx512Vnni => "x86_64",
            Level::Neon | Level::NeonDotprod | Level::NeonI8mm => "aarch64",
        }
    }

    /// The CPU features the level's code is compiled for, as std's feature detection names
    /// them.
    pub fn features(self) -> &'static [&'static str] {
        match self {
            Level::Portable => &[],
            Level::Avx2 => &["avx2", "fma"],
            Level::Avx2Vnni => &["avx2", "fma", "avxvnni"],
            Level::Avx512 => &["avx2", "fma", "avx512f", "avx512bw", "avx512vl"],
            Level::Avx512Vnni => &[
                "avx2",
                "fma",
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512vnni",
            ],
            Level::Neon => &["neon"],
            Level::NeonDotprod => &["neon", "dotprod"],
            Level::NeonI8mm => &["neon", "dotprod", "i8mm"],
        }
    }

    /// Why this CPU cannot run the level: another architecture, or the first feature it
    /// lacks. `None`: it can.
    pub fn missing(self) -> Option<String> {
        if self.arch() != ARCH {
            return Some(format!("it needs an {} CPU", self.arch()));
        }
        let lacking = self.features().iter().find(|f| !cpu_has(f))?;
        Some(format!("this CPU lacks {lacking}"))
    }

    /// Whether this CPU runs the level's code.
    pub fn supported(self) -> bool {
        self.missing().is_none()
    }

    /// The levels this CPU runs, portable first.
    pub fn supported_levels() -> Vec<Level> {
        Level::ALL.into_iter().filter(|l| l.supported()).collect()
    }

    /// The level the kernels run unless one is pinned: the fastest on paper among those this
    /// CPU has (detected once per process). On aarch64 that is `sdot`'s, not `smmla`'s: on
    /// the interleaved layout the `smmla` kernel issues about 1.5 times the instructions
    /// (docs/perf-notes.md, "CPU levels"); it is there to be measured on an ARM machine.
    pub fn best() -> Level {
        static BEST: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            [
                Level::Avx512Vnni,
                Level::Avx512,
                Level::Avx2Vnni,
                Level::Avx2,
                Level::NeonDotprod,
                Level::NeonI8mm,
                Level::Neon,
            ]
            .into_iter()
            .find(|l| l.supported())
            .unwrap_or(Level::Portable)
        })
    }

    /// The copy of the float loops the level runs: AVX-VNNI adds nothing to float code, and
    /// aarch64's NEON is its baseline.
    pub fn float_copy(self) -> FloatCopy {
        match self {
            Level::Avx512 | Level::Avx512Vnni => FloatCopy::Avx512,
            Level::Avx2 | Level::Avx2Vnni => FloatCopy::Avx2,
            Level::Portable | Level::Neon | Level::NeonDotprod | Level::NeonI8mm => {
                FloatCopy::Portable
            }
        }
    }

    /// Whether the level has a SIMD kernel for the q8 mode's interleaved layout (where it
    /// has none, the portable kernel on that layout is slower than the plain layout's).
    pub fn has_interleaved_q8_kernel(self) -> bool {
        !matches!(self, Level::Portable | Level::Neon)
    }
}

/// The architecture this build runs on, as [`Level::arch`] names it.
const ARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86_64"
} else if cfg!(target_arch = "aarch64") {
    "aarch64"
} else {
    "other"
};

/// Whether the CPU has `feature` (one of [`Level::features`]'s names; std caches the answer).
fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        match feature {
            "avx2" => has!("avx2"),
            "fma" => has!("fma"),
            "avxvnni" => has!("avxvnni"),
            "avx512f" => has!("avx512f"),
            "avx512bw" => has!("avx512bw"),
            "avx512vl" => has!("avx512vl"),
            "avx512vnni" => has!("avx512vnni"),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        match feature {
            "neon" => has!("neon"),
            "dotprod" => has!("dotprod"),
            "i8mm" => has!("i8mm"),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}

/// The selected level as its index in [`Level::ALL`] plus one; 0: none selected (the best).
static SELECTED: AtomicU8 = AtomicU8::new(0);

/// Pins the level every CPU kernel runs (the model's `QWEN_GDN_CPU_LEVEL`; `None`: the best
/// this CPU has). Process-wide, because the kernels that ask are leaves deep under every op
/// and the copies are chosen per CPU, not per model; set it before the first product (the
/// model's load does) so that every product of a run takes the same copy. A level the CPU
/// lacks is refused: `Err` says why, in words.
pub fn select_level(level: Option<Level>) -> Result<(), String> {
    let index = match level {
        None => 0,
        Some(l) => {
            if let Some(why) = l.missing() {
                return Err(format!("CPU level {}: {why}", l.name()));
            }
            Level::ALL.iter().position(|&a| a == l).expect("in ALL") as u8 + 1
        }
    };
    SELECTED.store(index, Ordering::Relaxed);
    Ok(())
}

/// The level the CPU kernels run: the selected one, else the best this CPU has.
#[inline]
pub fn level() -> Level {
    match SELECTED.load(Ordering::Relaxed) {
        0 => Level::best(),
        i => Level::ALL[i as usize - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for l in Level::ALL {
            assert_eq!(Level::from_name(l.name()), Some(l));
        }
        assert_eq!(Level::from_name("sse"), None);
    }

    /// The portable level runs everywhere and the best one is supported; a level of the other
    /// architecture is refused with the reason, and the selection is left as it was.
    #[test]
    fn unsupported_levels_are_refused_in_words() {
        assert!(Level::Portable.supported());
        assert!(Level::best().supported());
        let foreign = if cfg!(target_arch = "aarch64") {
            Level::Avx2
        } else {
            Level::NeonDotprod
        };
        let before = level();
        let e = select_level(Some(foreign)).unwrap_err();
        assert!(e.contains(foreign.name()) && e.contains("needs an"), "{e}");
        assert_eq!(level(), before);
    }
}
