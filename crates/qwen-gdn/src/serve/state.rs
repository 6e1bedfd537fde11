//! What every request handler shares: the worker's queue, the limits requests are checked
//! against, the metrics and the model's description.

use super::metrics::Metrics;
use super::model_facts::ModelFacts;
use super::openai::request::Limits;
use super::scheduler::Scheduler;
use std::sync::Arc;

pub struct AppState {
    pub scheduler: Scheduler,
    pub limits: Limits,
    pub max_request_bytes: usize,
    /// How long a request body may take to arrive (--body-timeout).
    pub body_timeout: std::time::Duration,
    pub metrics: Arc<Metrics>,
    pub model: ModelFacts,
}

impl AppState {
    /// The name replies give as their model.
    pub fn model_name(&self) -> &str {
        &self.limits.model_names[0]
    }
}
