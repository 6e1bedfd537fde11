//! One record per HTTP request: counted in /metrics when its response starts, and with
//! `--log-format json` written as one JSON line on stderr when it is over. "Over" is when
//! both its response body is done (sent, or dropped by a client that left) and its generation
//! ended on the worker: the record is shared by the two and the line is written when the last
//! holder lets go, so a cancelled stream is logged with the tokens it really generated.

use super::dialect::{Dialect, ErrorMessage};
use super::job::JobReport;
use super::metrics::Metrics;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use serde_json::{json, Map, Value as Json};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

/// How request lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// The worker's line per generation ("request: 12 prompt tokens (0 cached), ...").
    Text,
    /// One JSON object per HTTP request.
    Json,
}

pub struct Observer {
    pub metrics: Arc<Metrics>,
    pub format: LogFormat,
}

/// A request's record, handed to its handler as an extension (and by it to the worker).
#[derive(Clone)]
pub struct RequestLog(Arc<Record>);

struct Record {
    at: SystemTime,
    started: Instant,
    method: String,
    path: String,
    dialect: Dialect,
    json: bool,
    status: Mutex<Option<u16>>,
    error: Mutex<Option<String>>,
    job: Mutex<Option<JobReport>>,
}

impl RequestLog {
    /// What the worker measured of the request's generation.
    pub fn set_job(&self, report: JobReport) {
        *self.0.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if self.json {
            crate::ui::output::eprint_line(&self.line().to_string());
        }
    }
}

impl Record {
    fn line(&self) -> Json {
        let mut line = Map::new();
        line.insert(
            "time".into(),
            humantime::format_rfc3339_millis(self.at).to_string().into(),
        );
        line.insert("method".into(), self.method.clone().into());
        line.insert("path".into(), self.path.clone().into());
        line.insert("api".into(), self.dialect.name().into());
        line.insert("status".into(), json!(take(&self.status)));
        line.insert("duration_ms".into(), json!(millis(self.started.elapsed())));
        let job: Option<JobReport> = take(&self.job);
        let error: Option<String> =
            take(&self.error).or_else(|| job.as_ref().and_then(|j| j.error.clone()));
        if let Some(error) = error {
            line.insert("error".into(), error.into());
        }
        if let Some(job) = job {
            line.insert("finish".into(), job.finish.into());
            if let Some(u) = job.usage {
                line.insert("prompt_tokens".into(), u.prompt_tokens.into());
                line.insert("cached_tokens".into(), u.cached_tokens.into());
                line.insert("completion_tokens".into(), u.completion_tokens.into());
                if let Some(d) = u.drafts {
                    line.insert("verify_steps".into(), d.steps.into());
                    line.insert("draft_tokens".into(), d.proposed.into());
                    line.insert("accepted_draft_tokens".into(), d.accepted.into());
                }
            }
            line.insert("queue_ms".into(), json!(millis(job.queued)));
            if let Some(t) = job.time_to_first_token {
                line.insert("time_to_first_token_ms".into(), json!(millis(t)));
            }
            if let Some(rate) = job.tokens_per_second {
                line.insert(
                    "tokens_per_second".into(),
                    json!((rate * 100.0).round() / 100.0),
                );
            }
        }
        Json::Object(line)
    }
}

/// The value out of a slot (a poisoned lock still holds it).
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

/// The middleware: gives the handler its record, counts the response, and keeps the record
/// alive with the response body.
pub async fn observe(
    State(observer): State<Arc<Observer>>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_string();
    let dialect = Dialect::of_path(&path);
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let record = Arc::new(Record {
        at: SystemTime::now(),
        started: Instant::now(),
        method: request.method().to_string(),
        path,
        dialect,
        json: observer.format == LogFormat::Json,
        status: Mutex::new(None),
        error: Mutex::new(None),
        job: Mutex::new(None),
    });
    request.extensions_mut().insert(RequestLog(record.clone()));
    let response = next.run(request).await;
    let status = response.status().as_u16();
    observer
        .metrics
        .count_request(dialect.name(), &route, status);
    *record.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
    if let Some(ErrorMessage(message)) = response.extensions().get::<ErrorMessage>() {
        *record.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.clone());
    }
    response.map(|body| {
        Body::new(WithRecord {
            body,
            _record: record,
        })
    })
}

/// A response body that holds the request's record until it is dropped.
struct WithRecord {
    body: Body,
    _record: Arc<Record>,
}

impl http_body::Body for WithRecord {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
