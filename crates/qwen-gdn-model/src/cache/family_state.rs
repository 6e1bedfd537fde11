//! What a model family keeps in a layer's cache beside the mixer's own state (the GDN conv
//! window and recurrent state, or the keys and values), and how that part is copied, measured
//! and saved to a prompt-cache file. The cache and the prompt cache handle it through this
//! trait only: a family's state types, and the layout of their file fields, stay in the
//! family's folder (`families/qwen4_exp/state.rs` has the one family that keeps any).

use anyhow::Result;
use candle_core::{DType, Tensor};
use std::any::Any;
use std::fmt;

/// Reads one field of a layer from a prompt-cache file: `(name, dtype, dims)` → the tensor
/// on the model's device. It refuses, with a one-line error naming the file and the tensor, a
/// field that is missing, of another dtype or shape, or whose checksum does not match.
pub type FieldReader<'a> = dyn FnMut(&str, DType, &[usize]) -> Result<Tensor> + 'a;

/// A family's part of one layer's cache.
pub trait FamilyState: fmt::Debug + Send + Sync + Any {
    /// A copy that may share storage with `self` (as `Tensor::clone` does), for
    /// `Clone` of the cache.
    fn clone_box(&self) -> Box<dyn FamilyState>;

    /// A copy sharing no storage with `self`: what is updated in place must not advance
    /// both (`Cache::deep_clone`, snapshots).
    fn deep_clone(&self) -> Result<Box<dyn FamilyState>>;

    /// Bytes held, tensors and host data alike (the prompt cache's budget).
    fn bytes(&self) -> u64;

    /// The fields this state writes to a prompt-cache file: names unique within the layer
    /// (the file stores them as `layers.{i}.{name}`), and their tensors.
    fn snapshot_fields(&self) -> Result<Vec<(&'static str, Tensor)>>;

    /// The state after `tokens`, its fields read back through `read`. `self` is the layer's
    /// fresh state (as a new cache holds it): it gives the shapes and what a sequence
    /// starts from. What the file cannot hold wrong (a tensor's dtype and shape) `read`
    /// checks; anything else about the fields is checked here.
    fn load_snapshot_fields(
        &self,
        tokens: &[u32],
        read: &mut FieldReader,
    ) -> Result<Box<dyn FamilyState>>;

    /// The most bytes this layer's fields take in a file after `tokens` tokens (with the
    /// other layers', the bound on a file's size before it is read).
    fn max_field_bytes(&self, tokens: usize) -> u64;
}

impl Clone for Box<dyn FamilyState> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// `state`'s concrete type, when it is `T` (a family reaching its own state).
pub fn downcast_ref<T: FamilyState>(state: &dyn FamilyState) -> Option<&T> {
    let any: &dyn Any = state;
    any.downcast_ref()
}

/// As [`downcast_ref`], for a state about to be advanced.
pub fn downcast_mut<T: FamilyState>(state: &mut dyn FamilyState) -> Option<&mut T> {
    let any: &mut dyn Any = state;
    any.downcast_mut()
}
