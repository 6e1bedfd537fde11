//! How many requests `serve` decodes together (`--max-batch`). Each one holds its own caches:
//! GDN states of a fixed size and keys and values that grow with it, up to the context. The
//! rule counts every sequence at the full context (the most it can reach):
//! - the default is half the memory free after loading the model (the prompt cache takes a
//!   quarter by default) over one sequence's caches, at least 1 and at most 64; 8 where the
//!   free memory cannot be asked;
//! - an explicit `--max-batch N` whose sequences would not fit the free memory is shrunk to
//!   what fits, with a warning.

/// The default's ceiling: past it a step's rows no longer share their weight reads better.
pub const DEFAULT_CEILING: usize = 64;
/// The default where the free memory is unknown.
pub const DEFAULT_UNKNOWN: usize = 8;

/// The batch size, and the line that tells why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub max_batch: usize,
    pub line: String,
    /// The line is a warning (an asked size was shrunk).
    pub shrunk: bool,
}

/// `requested`: `--max-batch` (at least 1, checked by the flag's parser); `free`: bytes free
/// after loading; `per_sequence`: one sequence's caches at `context` positions.
pub fn choose(
    requested: Option<usize>,
    free: Option<u64>,
    per_sequence: u64,
    context: usize,
) -> Choice {
    let gb = |b: u64| b as f64 / 1e9;
    let per_sequence = per_sequence.max(1);
    let sized = format!(
        "{:.2} GB of caches a sequence at {context} positions",
        gb(per_sequence)
    );
    match (requested, free) {
        (None, None) => Choice {
            max_batch: DEFAULT_UNKNOWN,
            line: format!("--max-batch {DEFAULT_UNKNOWN} (the free memory is unknown; {sized})"),
            shrunk: false,
        },
        (None, Some(free)) => {
            let n = ((free / 2) / per_sequence).clamp(1, DEFAULT_CEILING as u64) as usize;
            Choice {
                max_batch: n,
                line: format!(
                    "--max-batch {n} (half of the {:.1} GB free over {sized}, at most {DEFAULT_CEILING})",
                    gb(free)
                ),
                shrunk: false,
            }
        }
        (Some(n), Some(free)) if (n as u64).saturating_mul(per_sequence) > free => {
            let fits = (free / per_sequence).max(1) as usize;
            Choice {
                max_batch: fits,
                line: format!(
                    "--max-batch {n} needs about {:.1} GB ({sized}), more than the {:.1} GB free: using {fits}",
                    gb(n as u64 * per_sequence),
                    gb(free)
                ),
                shrunk: true,
            }
        }
        (Some(n), _) => Choice {
            max_batch: n,
            line: format!("--max-batch {n} ({sized})"),
            shrunk: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn the_default_is_half_the_free_memory_over_a_sequence() {
        let c = choose(None, Some(40 * GB), 2 * GB, 4096);
        assert_eq!(c.max_batch, 10);
        assert!(c.line.contains("half of the 40.0 GB free"), "{}", c.line);
        assert!(!c.shrunk);
        assert_eq!(choose(None, Some(1000 * GB), GB, 1).max_batch, 64);
        assert_eq!(choose(None, Some(GB), 4 * GB, 1).max_batch, 1);
        assert_eq!(choose(None, None, GB, 1).max_batch, DEFAULT_UNKNOWN);
    }

    #[test]
    fn an_asked_size_past_the_free_memory_is_shrunk_with_a_warning() {
        let c = choose(Some(32), Some(10 * GB), GB, 8192);
        assert_eq!(c.max_batch, 10);
        assert!(c.shrunk);
        assert!(
            c.line
                .contains("--max-batch 32 needs about 32.0 GB (1.00 GB of caches a sequence at 8192 positions), more than the 10.0 GB free: using 10"),
            "{}",
            c.line
        );
        let c = choose(Some(4), Some(10 * GB), GB, 8192);
        assert_eq!((c.max_batch, c.shrunk), (4, false));
        assert_eq!(choose(Some(200), None, GB, 1).max_batch, 200);
    }
}
