//! An exclusive lock on `blobs/<etag>.lock`, so that one process downloads a blob while the
//! others wait for it. It is an advisory `flock`, the lock huggingface_hub's `filelock` takes on
//! the same file, so the processes we wait for may also be huggingface-cli or mlx-lm.

use anyhow::{Context, Result};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// How often a waiting process looks again (and redraws what it waits for).
const POLL: Duration = Duration::from_millis(200);

/// Held until dropped: closing the file releases the lock, also when the process dies.
pub struct BlobLock {
    _file: File,
}

impl BlobLock {
    /// Takes the lock at `path`, calling `waiting()` about five times a second for as long
    /// as another process holds it. No time limit: that process's own timeouts bound the wait.
    pub fn acquire(path: &Path, mut waiting: impl FnMut()) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Self { _file: file });
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => {}
                Some(libc::EINTR) => continue,
                _ => return Err(e).with_context(|| format!("cannot lock {}", path.display())),
            }
            waiting();
            std::thread::sleep(POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_for_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.lock");
        let first = BlobLock::acquire(&path, || panic!("the lock is free")).unwrap();
        let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = released.clone();
        let waiter = std::thread::spawn(move || {
            let mut waits = 0;
            // flock locks belong to the open file, so a second open in this process contends.
            let _second = BlobLock::acquire(&path, || waits += 1).unwrap();
            assert!(flag.load(std::sync::atomic::Ordering::SeqCst));
            waits
        });
        std::thread::sleep(Duration::from_millis(600));
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(first);
        assert!(waiter.join().unwrap() >= 1);
    }
}
