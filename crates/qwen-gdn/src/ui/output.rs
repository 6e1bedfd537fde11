//! Writing to stdout and stderr without `println!`/`eprintln!`, which panic when the write
//! fails. A closed stdout (`qwen-gdn … | head`) ends the output quietly; any other stdout
//! failure (a full disk) is an error naming stdout; a failing stderr is ignored, since there
//! is nowhere left to report it.

use anyhow::{Context, Result};
use std::io::Write;

/// Writes and flushes `text`; false when stdout is closed (e.g. piped into `head`).
pub fn emit(out: &mut impl Write, text: &str) -> Result<bool> {
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

/// One line to stdout, with [`emit`]'s handling of a closed pipe.
pub fn print_line(text: &str) -> Result<bool> {
    emit(&mut std::io::stdout().lock(), &format!("{text}\n"))
}

/// One line to stderr; a failure to write it is dropped.
pub fn eprint_line(text: &str) {
    // One write of the whole line: the ranks of an `mpirun` job share one stderr, and a line
    // written in pieces interleaves with another rank's.
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{text}\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that fails every write with `kind`.
    struct Failing(std::io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn closed_pipe_ends_quietly_and_other_failures_are_errors() {
        let mut buf = Vec::new();
        assert!(emit(&mut buf, "hi").unwrap());
        assert_eq!(buf, b"hi");
        assert!(!emit(&mut Failing(std::io::ErrorKind::BrokenPipe), "x").unwrap());
        let err = emit(&mut Failing(std::io::ErrorKind::StorageFull), "x").unwrap_err();
        assert!(
            format!("{err:#}").starts_with("writing to stdout"),
            "{err:#}"
        );
    }
}
