//! `GET /metrics`: the server's counters in the Prometheus exposition format (OpenMetrics
//! text, through the Prometheus project's `prometheus-client` crate). Requests are counted by
//! the request log's middleware as their responses start; generations by the worker before it
//! sends a job's last event, so a client that scrapes right after its reply sees it counted.

use super::job::JobReport;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, String)>;

/// The prompt cache's gauges in /metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptCacheStats {
    pub bytes: u64,
    pub budget: u64,
    pub entries: usize,
}

impl PromptCacheStats {
    pub fn of(cache: &qwen_gdn_model::PromptCache) -> Self {
        Self {
            bytes: cache.bytes(),
            budget: cache.budget(),
            entries: cache.len(),
        }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    generations: Family<Labels, Counter>,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    cache_hits: Counter,
    cache_misses: Counter,
    cached_tokens: Counter,
    cache_bytes: Gauge,
    cache_budget: Gauge,
    cache_entries: Gauge,
    queue_depth: Gauge,
    running: Gauge,
    time_to_first_token: Histogram,
    tokens_per_second: Histogram,
    verify_steps: Counter,
    draft_tokens: Counter,
    accepted_draft_tokens: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("qwen_gdn");
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by API, route and status",
            requests.clone(),
        );
        let generations = Family::<Labels, Counter>::default();
        registry.register(
            "generations",
            "Generations run by the worker, by how they ended (stop, length, cancelled, error)",
            generations.clone(),
        );
        let prompt_tokens = Counter::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens of finished generations (cached ones included)",
            prompt_tokens.clone(),
        );
        let generation_tokens = Counter::default();
        registry.register(
            "generation_tokens",
            "Tokens generated",
            generation_tokens.clone(),
        );
        let cache_hits = Counter::default();
        registry.register(
            "prompt_cache_hits",
            "Generations whose prompt started from the prompt cache",
            cache_hits.clone(),
        );
        let cache_misses = Counter::default();
        registry.register(
            "prompt_cache_misses",
            "Generations whose prompt was prefilled from the start",
            cache_misses.clone(),
        );
        let cached_tokens = Counter::default();
        registry.register(
            "prompt_cache_tokens",
            "Prompt tokens taken from the prompt cache instead of prefilled",
            cached_tokens.clone(),
        );
        let cache_bytes = Gauge::default();
        registry.register_with_unit(
            "prompt_cache",
            "Bytes the prompt cache holds",
            Unit::Bytes,
            cache_bytes.clone(),
        );
        let cache_budget = Gauge::default();
        registry.register_with_unit(
            "prompt_cache_budget",
            "The prompt cache's budget (--prompt-cache-bytes)",
            Unit::Bytes,
            cache_budget.clone(),
        );
        let cache_entries = Gauge::default();
        registry.register(
            "prompt_cache_entries",
            "Snapshots in the prompt cache",
            cache_entries.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Requests waiting for the generation worker",
            queue_depth.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "requests_running",
            "Generations running together (at most --max-batch)",
            running.clone(),
        );
        // 10 ms to about 5 min.
        let time_to_first_token = Histogram::new(exponential_buckets(0.01, 2.0, 15));
        registry.register_with_unit(
            "time_to_first_token",
            "From a request's arrival in the queue to its first text",
            Unit::Seconds,
            time_to_first_token.clone(),
        );
        // 0.5 to about 4000 tokens a second.
        let tokens_per_second = Histogram::new(exponential_buckets(0.5, 2.0, 14));
        registry.register(
            "generation_tokens_per_second",
            "Decode speed of each generation: tokens after the first over the time they took",
            tokens_per_second.clone(),
        );
        // vLLM's spec_decode counters, by their meaning.
        let verify_steps = Counter::default();
        registry.register(
            "spec_decode_verify_steps",
            "Speculative decoding: forward passes of the model over drafted tokens",
            verify_steps.clone(),
        );
        let draft_tokens = Counter::default();
        registry.register(
            "spec_decode_draft_tokens",
            "Speculative decoding: draft tokens the MTP head proposed",
            draft_tokens.clone(),
        );
        let accepted_draft_tokens = Counter::default();
        registry.register(
            "spec_decode_accepted_tokens",
            "Speculative decoding: draft tokens the model accepted",
            accepted_draft_tokens.clone(),
        );
        Self {
            registry,
            requests,
            generations,
            prompt_tokens,
            generation_tokens,
            cache_hits,
            cache_misses,
            cached_tokens,
            cache_bytes,
            cache_budget,
            cache_entries,
            queue_depth,
            running,
            time_to_first_token,
            tokens_per_second,
            verify_steps,
            draft_tokens,
            accepted_draft_tokens,
        }
    }

    pub fn count_request(&self, api: &'static str, route: &str, status: u16) {
        self.requests
            .get_or_create(&vec![
                ("api", api.to_string()),
                ("route", route.to_string()),
                ("status", status.to_string()),
            ])
            .inc();
    }

    pub fn queued(&self) {
        self.queue_depth.inc();
    }

    /// A job left the queue: it runs now (or was dropped, its client gone).
    pub fn dequeued(&self) {
        self.queue_depth.dec();
    }

    pub fn set_running(&self, running: usize) {
        self.running.set(i64::try_from(running).unwrap_or(i64::MAX));
    }

    pub fn count_generation(&self, report: &JobReport) {
        self.generations
            .get_or_create(&vec![("finish", report.finish.to_string())])
            .inc();
        if let Some(usage) = &report.usage {
            self.prompt_tokens.inc_by(usage.prompt_tokens as u64);
            self.generation_tokens
                .inc_by(usage.completion_tokens as u64);
            self.cached_tokens.inc_by(usage.cached_tokens as u64);
            if usage.cached_tokens > 0 {
                self.cache_hits.inc();
            } else {
                self.cache_misses.inc();
            }
            if let Some(d) = &usage.drafts {
                self.verify_steps.inc_by(d.steps as u64);
                self.draft_tokens.inc_by(d.proposed as u64);
                self.accepted_draft_tokens.inc_by(d.accepted as u64);
            }
        }
        if let Some(t) = report.time_to_first_token {
            self.time_to_first_token.observe(t.as_secs_f64());
        }
        if let Some(rate) = report.tokens_per_second {
            self.tokens_per_second.observe(rate);
        }
    }

    pub fn set_prompt_cache(&self, stats: &PromptCacheStats) {
        let gauge = |g: &Gauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        gauge(&self.cache_bytes, stats.bytes);
        gauge(&self.cache_budget, stats.budget);
        gauge(&self.cache_entries, stats.entries as u64);
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::{Drafts, Usage};
    use std::time::Duration;

    #[test]
    fn counts_render_as_openmetrics() {
        let m = Metrics::new();
        m.count_request("openai", "/v1/models", 200);
        m.count_request("openai", "/v1/models", 200);
        m.queued();
        m.count_generation(&JobReport {
            finish: "stop",
            usage: Some(Usage {
                prompt_tokens: 10,
                cached_tokens: 4,
                completion_tokens: 5,
                drafts: Some(Drafts {
                    steps: 3,
                    proposed: 6,
                    accepted: 4,
                }),
            }),
            time_to_first_token: Some(Duration::from_millis(30)),
            tokens_per_second: Some(12.0),
            ..Default::default()
        });
        m.set_prompt_cache(&PromptCacheStats {
            bytes: 1234,
            budget: 5000,
            entries: 2,
        });
        let text = m.render();
        for line in [
            "qwen_gdn_http_requests_total{api=\"openai\",route=\"/v1/models\",status=\"200\"} 2",
            "qwen_gdn_generations_total{finish=\"stop\"} 1",
            "qwen_gdn_prompt_tokens_total 10",
            "qwen_gdn_generation_tokens_total 5",
            "qwen_gdn_prompt_cache_tokens_total 4",
            "qwen_gdn_prompt_cache_hits_total 1",
            "qwen_gdn_prompt_cache_misses_total 0",
            "qwen_gdn_prompt_cache_bytes 1234",
            "qwen_gdn_prompt_cache_budget_bytes 5000",
            "qwen_gdn_prompt_cache_entries 2",
            "qwen_gdn_queue_depth 1",
            "qwen_gdn_time_to_first_token_seconds_count 1",
            "qwen_gdn_time_to_first_token_seconds_bucket{le=\"0.04\"} 1",
            "qwen_gdn_time_to_first_token_seconds_bucket{le=\"0.02\"} 0",
            "qwen_gdn_generation_tokens_per_second_sum 12.0",
            "qwen_gdn_spec_decode_verify_steps_total 3",
            "qwen_gdn_spec_decode_draft_tokens_total 6",
            "qwen_gdn_spec_decode_accepted_tokens_total 4",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
