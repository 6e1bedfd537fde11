//! Progress bars over bytes (downloads, loading the weights), drawn on stderr only when it is
//! a terminal: logs and pipes get none of the redraws.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::borrow::Cow;
use std::io::IsTerminal;

/// Whether bars are drawn; when not, rare events worth a line (waiting on another process)
/// are printed as plain lines instead.
pub fn visible() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar for `len` bytes (a spinner with the byte count while the length is unknown).
pub fn bytes(len: Option<u64>, message: impl Into<Cow<'static, str>>) -> ProgressBar {
    let target = if visible() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(len, target);
    let template = "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";
    let style = ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(message);
    bar
}
