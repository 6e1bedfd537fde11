//! Observers of the layer loop, in the spirit of llama.cpp's graph callback `cb(cur, name, il)`:
//! every family runs its layers through [`each_layer`], which tells a [`Tap`] when a layer
//! starts and ends, and the family's layers tell it what each part added to the residual
//! stream. Launch counting per layer ([`LaunchCounter`]), NaN tracing ([`crate::diagnose`])
//! and phase timing ([`crate::phase_profile::PhaseTimer`]) are taps; the forward itself runs
//! with [`NoTap`]. Kernel launches are still counted where they happen (`gdn_ops::launches`):
//! a tap only reads the counter.

use anyhow::Result;
use candle_core::Tensor;
use std::fmt;

/// A part of the model whose output a tap sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The token embedding (before any layer).
    Embedding,
    /// `qwen4_exp`: the per-layer (n-gram) embedding of decoder layer `layer` (on the layers
    /// that have one).
    PerLayerEmbedding { layer: usize },
    /// The attention or GDN block of decoder layer `layer` (for `qwen4_exp` with the
    /// hyper-connection around it).
    Mixer { layer: usize, attention: bool },
    /// The MLP or MoE block of decoder layer `layer` (for `qwen4_exp` with the
    /// hyper-connection around it).
    FeedForward { layer: usize, moe: bool },
    /// The final norm (or what takes its place) and the output head: `added` and `stream`
    /// are the logits. Only passes that compute logits show it.
    OutputHead,
}

/// What a tap watches. Every method has a default that does nothing.
pub trait Tap: Send {
    /// A forward pass is about to embed its tokens.
    fn begin_pass(&mut self) -> Result<()> {
        Ok(())
    }

    /// Decoder layer `layer` is about to run.
    fn enter_layer(&mut self, _layer: usize) -> Result<()> {
        Ok(())
    }

    /// `part` has run: `added` is what it contributed (for a hyper-connected family, the
    /// streams themselves), `stream` the residual stream after it. An error ends the walk
    /// (a tap that has seen enough returns [`Stopped`]).
    fn part(&mut self, _part: Part, _added: &Tensor, _stream: &Tensor) -> Result<()> {
        Ok(())
    }

    /// Decoder layer `layer` has run.
    fn leave_layer(&mut self, _layer: usize) {}
}

/// The tap of a plain forward pass: watches nothing.
pub struct NoTap;

impl Tap for NoTap {}

/// Returned by a tap that has seen what it was looking for: the walk stops there, and the
/// caller that set the tap reads its finding (`anyhow::Error::is::<Stopped>`).
#[derive(Debug)]
pub struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a tap stopped the layer loop")
    }
}

impl std::error::Error for Stopped {}

/// Counts the kernel launches of each layer, its host uploads and read-backs: the
/// differences of [`gdn_ops::launches::count`], [`gdn_ops::launches::uploads`] and
/// [`gdn_ops::launches::read_backs`] around it (counted where the
/// kernels are launched and the copies made).
#[derive(Debug, Default)]
pub struct LaunchCounter {
    pub per_layer: Vec<usize>,
    pub uploads_per_layer: Vec<usize>,
    /// Host reads of device values ([`gdn_ops::launches::read_back`]): a step with any cannot
    /// be captured as a CUDA graph.
    pub read_backs_per_layer: Vec<usize>,
    before: (usize, usize, usize),
}

impl Tap for LaunchCounter {
    fn enter_layer(&mut self, _layer: usize) -> Result<()> {
        self.before = (
            gdn_ops::launches::count(),
            gdn_ops::launches::uploads(),
            gdn_ops::launches::read_backs(),
        );
        Ok(())
    }

    fn leave_layer(&mut self, _layer: usize) {
        self.per_layer
            .push(gdn_ops::launches::count() - self.before.0);
        self.uploads_per_layer
            .push(gdn_ops::launches::uploads() - self.before.1);
        self.read_backs_per_layer
            .push(gdn_ops::launches::read_backs() - self.before.2);
    }
}

/// The one layer loop: runs `step` for each layer with its cache, threading `state` (the
/// residual stream, or whatever a family's step carries) through, and tells `tap` where each
/// layer starts and ends.
pub fn each_layer<L, C, S>(
    layers: &[L],
    caches: &mut [C],
    tap: &mut dyn Tap,
    mut state: S,
    mut step: impl FnMut(usize, &L, &mut C, S, &mut dyn Tap) -> Result<S>,
) -> Result<S> {
    anyhow::ensure!(
        layers.len() == caches.len(),
        "cache does not belong to this model"
    );
    for (i, (layer, cache)) in layers.iter().zip(caches.iter_mut()).enumerate() {
        tap.enter_layer(i)?;
        state = step(i, layer, cache, state, tap)?;
        tap.leave_layer(i);
    }
    Ok(state)
}
