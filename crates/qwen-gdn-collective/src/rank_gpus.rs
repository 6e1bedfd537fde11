//! Which GPU each rank of a one-host NCCL job takes (`--ranks N`, `rank_launch.rs`).

use anyhow::{ensure, Result};

/// The GPUs the ranks take, in rank order: the launcher's own `CUDA_VISIBLE_DEVICES` entries
/// when it has them, else the host's devices from 0; an error naming the count when there are
/// fewer than `ranks`.
pub fn rank_gpus(ranks: usize, visible: Option<&str>, host_devices: usize) -> Result<Vec<String>> {
    let listed: Vec<String> = match visible {
        Some(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        _ => (0..host_devices).map(|d| d.to_string()).collect(),
    };
    ensure!(
        listed.len() >= ranks,
        "--ranks {ranks}: one CUDA GPU a rank, but {} {} visible{}",
        listed.len(),
        if listed.len() == 1 { "is" } else { "are" },
        if visible.is_some() {
            " (CUDA_VISIBLE_DEVICES)"
        } else {
            ""
        }
    );
    Ok(listed.into_iter().take(ranks).collect())
}

#[cfg(test)]
mod tests {
    use super::rank_gpus;

    #[test]
    fn ranks_take_the_visible_gpus_in_order() {
        assert_eq!(rank_gpus(2, None, 4).unwrap(), ["0", "1"]);
        assert_eq!(rank_gpus(2, Some("3, 1,2"), 8).unwrap(), ["3", "1"]);
        assert_eq!(rank_gpus(1, Some(""), 1).unwrap(), ["0"]);
        let err = rank_gpus(3, None, 2).unwrap_err().to_string();
        assert_eq!(err, "--ranks 3: one CUDA GPU a rank, but 2 are visible");
        let err = rank_gpus(2, Some("5"), 8).unwrap_err().to_string();
        assert_eq!(
            err,
            "--ranks 2: one CUDA GPU a rank, but 1 is visible (CUDA_VISIBLE_DEVICES)"
        );
    }
}
