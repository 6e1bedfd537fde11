//! The check every parallel plan runs before work: all ranks loaded the same config and
//! checkpoint (a hash of the tensor headers) under the same plan, in the same dtype and
//! execution plan; otherwise every rank refuses with one line naming the rank that differs.

use crate::Model;
use anyhow::Result;
use qwen_gdn_collective::{ensure_same_fingerprint, Collective};
use sha2::{Digest, Sha256};

/// `plan`: the plan's own description (its split), `what`: the words of the refusal.
pub(crate) fn ensure_ranks_agree(
    world: &dyn Collective,
    model: &Model,
    plan: &str,
    what: &str,
) -> Result<()> {
    let mut hash = Sha256::new();
    hash.update(format!("{:?}", model.config()));
    hash.update(model.checkpoint_fingerprint().to_le_bytes());
    hash.update(format!("{plan} {:?} {:?}", model.dtype(), model.plan()));
    let fingerprint = u64::from_le_bytes(hash.finalize()[..8].try_into().expect("8 bytes"));
    ensure_same_fingerprint(world, fingerprint, what)
}
