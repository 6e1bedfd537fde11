//! Ranks must run the same model: each hashes its config and tensor list, and all compare.

use crate::Collective;
use anyhow::{bail, Result};

/// FNV-1a of `bytes`: a fingerprint that is the same on every rank, whatever build or
/// platform it runs (unlike `std`'s hashers, whose seeds and algorithm may differ).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Gathers every rank's `fingerprint` and fails, on every rank, with one line naming the first
/// rank that differs from rank 0 (`what` says what was hashed, e.g. "config and tensors").
pub fn ensure_same_fingerprint(world: &dyn Collective, fingerprint: u64, what: &str) -> Result<()> {
    let all = world.all_gather_u64(fingerprint)?;
    if let Some((rank, theirs)) = all.iter().enumerate().find(|(_, f)| **f != all[0]) {
        bail!(
            "rank {rank} disagrees with rank 0 on the {what} (hash {theirs:016x}, rank 0 has {:016x})",
            all[0]
        );
    }
    Ok(())
}
