//! Process memory figures shared by the subcommands that report them.

/// Peak resident set size of this process (getrusage's ru_maxrss: KiB on Linux, bytes on macOS).
pub fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage only writes the struct it is given.
    let maxrss = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_maxrss as u64
    };
    if cfg!(target_os = "macos") {
        maxrss
    } else {
        maxrss * 1024
    }
}

/// The peak to report and where it comes from: the GPU's peak where the device reports one
/// (Metal, CUDA; the weights live there, and RSS does not count them), else the process's
/// peak RSS.
pub fn peak() -> (u64, &'static str) {
    match qwen_gdn_model::device_memory::peak_bytes() {
        Some(bytes) => (bytes, "gpu"),
        None => (peak_rss_bytes(), "rss"),
    }
}
