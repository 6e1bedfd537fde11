//! How many connections `serve` keeps open at once. Every connection holds a file descriptor;
//! a server that accepts until the process runs out of them can no longer accept anyone (nor
//! open a file), and on macOS the default limit is 256. So the cap is chosen below the
//! descriptor limit (RLIMIT_NOFILE, read at start), with room for the process's own files,
//! and a few connections beyond it are kept for `/health` (connections.rs).

use anyhow::{bail, Result};

/// Descriptors left for the process itself: stdio, the listener, the async runtime's epoll and
/// wakers, the checkpoint's and tokenizer's files while they are read, prompt-cache files, and
/// a connection accepted over the cap only to be closed.
const HEADROOM: u64 = 64;
/// The cap when the descriptor limit allows more: one generation runs at a time, so more
/// clients than this only wait.
const DEFAULT_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCap {
    /// Connections served in full.
    pub max: usize,
    /// Connections over `max` that may still ask for `/health` (everything else on them is
    /// answered 503); when these are all taken, the oldest is closed for the newcomer.
    pub health_reserve: usize,
}

impl ConnectionCap {
    /// The cap for `requested` connections (`--max-connections`; `None`: as many as the
    /// descriptor limit allows, at most 1024) under a descriptor limit of `limit` (`None`:
    /// unknown or unlimited).
    pub fn choose(requested: Option<usize>, limit: Option<u64>) -> Result<Self> {
        let usable = limit.map(|l| l.saturating_sub(HEADROOM));
        let max = match (requested, usable) {
            (Some(n), None) => n,
            (None, None) => DEFAULT_MAX,
            (None, Some(usable)) => {
                let room = usable.saturating_sub(reserve_for(usable as usize) as u64);
                usize::try_from(room).unwrap_or(usize::MAX).min(DEFAULT_MAX)
            }
            (Some(n), Some(usable)) => {
                if (n + reserve_for(n)) as u64 > usable {
                    let most = usable.saturating_sub(reserve_for(usable as usize) as u64);
                    bail!(
                        "--max-connections {n} does not fit the descriptor limit of {} open \
                         files (at most {most}); raise it (`ulimit -n`) or ask for fewer",
                        limit.unwrap_or(0)
                    );
                }
                n
            }
        };
        if max < 1 {
            bail!(
                "the descriptor limit of {} open files leaves no room for connections; raise \
                 it (`ulimit -n`)",
                limit.unwrap_or(0)
            );
        }
        Ok(Self {
            max,
            health_reserve: reserve_for(max),
        })
    }
}

/// The /health connections kept beyond a cap of `max`: a sixteenth, from 2 to 32.
fn reserve_for(max: usize) -> usize {
    (max / 16).clamp(2, 32)
}

/// The process's soft limit on open files; `None` when unlimited or unknown.
// rlim_t is u64 on the platforms qwen-gdn runs on, narrower on some others.
#[allow(clippy::useless_conversion)]
pub fn descriptor_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        if !ok || limit.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        u64::try_from(limit.rlim_cur).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::ConnectionCap;

    #[test]
    fn the_cap_stays_below_the_descriptor_limit() {
        // macOS's default: 256 descriptors.
        let cap = ConnectionCap::choose(None, Some(256)).unwrap();
        assert!(cap.max + cap.health_reserve + 64 <= 256, "{cap:?}");
        assert_eq!(
            cap,
            ConnectionCap {
                max: 180,
                health_reserve: 11
            }
        );
        // Linux's usual 1024, and a generous limit.
        let cap = ConnectionCap::choose(None, Some(1024)).unwrap();
        assert!(cap.max + cap.health_reserve + 64 <= 1024, "{cap:?}");
        assert_eq!(
            ConnectionCap::choose(None, Some(1 << 20)).unwrap().max,
            1024
        );
        assert_eq!(ConnectionCap::choose(None, None).unwrap().max, 1024);
        // An explicit cap is kept when it fits, refused when it does not.
        assert_eq!(
            ConnectionCap::choose(Some(100), Some(256)).unwrap().max,
            100
        );
        let e = ConnectionCap::choose(Some(300), Some(256)).unwrap_err();
        assert!(e.to_string().contains("--max-connections 300"), "{e}");
        assert!(ConnectionCap::choose(None, Some(40)).is_err());
    }
}
