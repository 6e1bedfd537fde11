//! The QSA mixer's parts: the attention and the indexer that selects its key blocks. Its own
//! file so that the decoder (which builds it) and the fused step (which runs it) both name it
//! without importing each other.

use super::qsa_indexer::QsaIndexer;
use crate::layers::attention::Attention;

/// The QSA mixer: the attention and its indexer.
#[derive(Debug)]
pub struct IndexedAttention {
    pub attention: Attention,
    pub indexer: QsaIndexer,
}
