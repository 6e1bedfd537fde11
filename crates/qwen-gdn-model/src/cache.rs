//! Per-sequence state carried between forward calls: for each GDN layer the last `K-1`
//! pre-conv rows and the recurrent state, for each attention layer its keys and values.

use candle_core::Tensor;

#[derive(Debug, Clone, Default)]
pub struct GdnCache {
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
