//! The shipped shaders as macOS 13's Metal compiler (MSL 3.0, no `bfloat`) sees them: they
//! must still compile, with every non-bfloat entry point and none of the bfloat ones, so that
//! the host can fall back to f16 there. Compiled as C++ by clang-19 through `kernels/emu/`
//! with `METAL_EMU_MSL30`, which removes `bfloat` and `__HAVE_BFLOAT__`.

use std::path::Path;
use std::process::Command;

/// `kernels/<file>` compiled (`-fsyntax-only`) and preprocessed under MSL 3.0 rules; returns
/// the preprocessed text.
fn as_msl30(file: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cxx = std::env::var("GDN_EMU_CXX").unwrap_or_else(|_| "clang++-19".into());
    let run = |mode: &str| {
        let out = Command::new(&cxx)
            .args([
                "-x",
                "c++",
                "-std=c++17",
                "-Wall",
                "-Werror",
                "-DMETAL_EMU_MSL30",
                mode,
            ])
            // NAN and friends, which <metal_stdlib> has and the emulation's harnesses include.
            .args(["-include", "cmath"])
            .arg("-I")
            .arg(root.join("kernels/emu"))
            .arg(root.join("kernels").join(file))
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{cxx}` (clang 19, or set GDN_EMU_CXX): {e}"));
        assert!(
            out.status.success(),
            "{file} does not compile without bfloat (MSL 3.0):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run("-fsyntax-only");
    run("-E")
}

/// Entry points defined in preprocessed text: `KERNEL(name, ...)` has expanded to `void name(`.
fn defines(text: &str, name: &str) -> bool {
    text.contains(&format!("void {name}("))
}

#[test]
fn gated_delta_builds_without_bfloat() {
    let text = as_msl30("gated_delta.metal");
    for name in ["gated_delta_step_f32_f32", "gated_delta_step_f16_f32"] {
        assert!(defines(&text, name), "{name} missing");
    }
    for name in [
        "gated_delta_step_f32_bf16",
        "gated_delta_step_f16_bf16",
        "gated_delta_step_bf16_f32",
        "gated_delta_step_bf16_bf16",
    ] {
        assert!(!defines(&text, name), "{name} needs bfloat");
    }
}

#[test]
fn affine_builds_without_bfloat() {
    let text = as_msl30("affine.metal");
    let tags = ["f32", "f16", "bf16"];
    for kernel in ["affine_qmv", "affine_dequant"] {
        for a in tags {
            for s in tags {
                let name = format!("{kernel}_{a}_{s}");
                let bf16 = a == "bf16" || s == "bf16";
                assert_eq!(defines(&text, &name), !bf16, "{name}");
            }
        }
    }
}

/// Every shipped shader, the fused decode kernels included: it compiles without bfloat, keeps
/// its f32 entry points, and defines no bf16 one.
#[test]
fn every_shader_builds_without_bfloat() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".metal"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "no shaders found in {}", dir.display());
    for file in files {
        let text = as_msl30(&file);
        let entry_points: Vec<&str> = text
            .split("void ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .filter(|name| name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        assert!(
            entry_points.iter().any(|n| n.contains("_f32")),
            "{file}: no f32 entry point left without bfloat"
        );
        if let Some(n) = entry_points.iter().find(|n| n.contains("bf16")) {
            panic!("{file}: `{n}` is defined without bfloat (guard it with __HAVE_BFLOAT__)");
        }
    }
}

#[test]
fn gated_delta_chunk_builds_without_bfloat() {
    // simdgroup_float8x8 and simdgroup_half8x8 are MSL 2.3; simdgroup_bfloat8x8 needs bfloat.
    let text = as_msl30("gated_delta_chunk.metal");
    for name in [
        "gated_delta_chunk_prep_f32",
        "gated_delta_chunk_prep_f16",
        "gated_delta_chunk_state_f32_f32",
        "gated_delta_chunk_state_f16_f32",
        "gated_delta_chunk_out_f32",
        "gated_delta_chunk_out_f16",
    ] {
        assert!(defines(&text, name), "{name} missing");
    }
    for name in [
        "gated_delta_chunk_prep_bf16",
        "gated_delta_chunk_state_f32_bf16",
        "gated_delta_chunk_state_f16_bf16",
        "gated_delta_chunk_state_bf16_f32",
        "gated_delta_chunk_state_bf16_bf16",
        "gated_delta_chunk_out_bf16",
    ] {
        assert!(!defines(&text, name), "{name} needs bfloat");
    }
}

#[test]
fn affine_grouped_builds_without_bfloat() {
    // simdgroup_half8x8 is MSL 2.3; simdgroup_bfloat8x8 needs bfloat.
    let text = as_msl30("affine_grouped.metal");
    let tags = ["f32", "f16", "bf16"];
    for a in tags {
        for s in tags {
            let name = format!("affine_grouped_qmm_{a}_{s}");
            let bf16 = a == "bf16" || s == "bf16";
            assert_eq!(defines(&text, &name), !bf16, "{name}");
        }
    }
}
