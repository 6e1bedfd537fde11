//! Upper bounds on config.json's sizes, checked before anything loops over or allocates by
//! them (a config with `num_hidden_layers = 1e18` would otherwise spin in validation). Each
//! is far above any released model and low enough that the products the loaders form
//! (experts × rows × cols) fit a 64-bit `usize`. Every family's `validate` checks its own
//! sizes against these first.

use anyhow::{bail, Result};

pub const MAX_LAYERS: usize = 1024;
pub const MAX_WIDTH: usize = 1 << 20;
pub const MAX_VOCAB: usize = 1 << 24;
pub const MAX_POSITIONS: usize = 1 << 24;
pub const MAX_HEADS: usize = 1 << 12;
pub const MAX_HEAD_DIM: usize = 1 << 12;
pub const MAX_CONV_KERNEL: usize = 64;
pub const MAX_EXPERTS: usize = 1 << 14;

/// Refuses the first `(key, value, max)` whose value is above its bound.
pub fn check_upper_bounds(origin: &str, bounded: &[(&str, usize, usize)]) -> Result<()> {
    for &(key, v, max) in bounded {
        if v > max {
            bail!("{origin}: `{key}` = {v} is larger than this engine supports ({max})");
        }
    }
    Ok(())
}
