//! With the `cuda` feature, compiles every `kernels/*.cu` to PTX (sm_90) into OUT_DIR as
//! `<name>.ptx`, for the ops' `include_str!` (adding an op needs no change here). nvcc is `$NVCC`, else `nvcc` on PATH (scripts/gpu/build-cuda.sh provides
//! CUDA 13.0's from PyPI; a newer nvcc emits PTX that the device's driver may reject).
//! Without the feature it does nothing.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let arch = format!(
        "-arch=sm_{}",
        std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into())
    );
    let kernels = Path::new("../../kernels");
    // The directory itself (cargo scans it whole): a new .cu file reruns the script too, which
    // its per-file lines below cannot see (the seventeenth session's affine_mma.cu was not
    // compiled until this line).
    println!("cargo:rerun-if-changed={}", kernels.display());
    // The parameter headers and the conversions every .cu includes.
    println!(
        "cargo:rerun-if-changed={}",
        kernels.join("params").display()
    );
    for header in [
        "cuda_convert.h",
        "cuda_block_sum.h",
        "affine_row_group.h",
        "affine_word_dot.h",
    ] {
        println!("cargo:rerun-if-changed={}", kernels.join(header).display());
    }
    let mut sources: Vec<_> = std::fs::read_dir(kernels)
        .expect("kernels/ beside the crates")
        .map(|e| e.expect("kernels/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    for source in sources {
        let name = source.file_stem().expect("a .cu file").to_string_lossy();
        println!("cargo:rerun-if-changed={}", source.display());
        let ptx = Path::new(&out_dir).join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["-ptx", &arch, "-O3", "-I"])
            .arg(kernels)
            .arg(&source)
            .arg("-o")
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {nvcc} (set NVCC or PATH): {e}"));
        assert!(status.success(), "{nvcc} failed on {}", source.display());
    }
}
