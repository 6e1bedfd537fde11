//! Per-sequence state carried between forward calls: for each GDN layer the last `K-1`
//! pre-conv rows and the recurrent state, for each attention layer its keys and values.

use crate::StateDtype;
use candle_core::Tensor;

#[derive(Debug, Clone, Default)]
pub struct GdnCache {
    /// How the recurrent state is stored; a state held in the other dtype is converted on
    /// the next forward call, never rejected.
    pub state_dtype: StateDtype,
    /// `[B, K-1, conv_dim]`, pre-activation inputs of the depthwise conv.
    pub conv: Option<Tensor>,
    /// `[B, Hv, Dv, Dk]`, updated in place by the recurrence.
    pub state: Option<Tensor>,
}

#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// `[B, Nkv, T, Dh]`, post-RoPE.
    pub keys: Option<Tensor>,
    pub values: Option<Tensor>,
}

#[derive(Debug, Clone)]
pub enum LayerCache {
    Gdn(GdnCache),
    Attention(KvCache),
}

/// Decoding state of one sequence.
#[derive(Debug, Clone)]
pub struct Cache {
    /// Number of tokens already processed (the RoPE position of the next one).
    pub offset: usize,
    pub layers: Vec<LayerCache>,
}

impl Cache {
    /// Switches the storage dtype of every GDN recurrent state from the next forward on.
    pub fn set_gdn_state_dtype(&mut self, dtype: StateDtype) {
        for layer in &mut self.layers {
            if let LayerCache::Gdn(c) = layer {
                c.state_dtype = dtype;
            }
        }
    }
}
