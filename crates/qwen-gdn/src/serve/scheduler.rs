//! One generation at a time on the device: a worker thread owns the model (and with it the
//! prompt cache, shared by all requests) and takes jobs first come, first served from a
//! bounded queue. A full queue is a 503. Each job carries a cancel flag that its request sets
//! when it is dropped (the client went away), which the generation checks at every token.
//! A panic inside a generation is caught and answered 500; the worker keeps serving.
//! The worker measures each job (queueing, time to first token, decode speed) for /metrics
//! and the request log.

use super::error::ApiError;
use super::job::{Event, Finish, JobReport, JobSpec, Prompt, Usage};
use super::metrics::{Metrics, PromptCacheStats};
use super::request_log::RequestLog;
use super::test_hooks;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// What runs a job on the device: the engine in the server, a fake in unit tests.
pub trait Backend: Send + 'static {
    /// Renders and tokenizes the prompt, sends [`Event::Prompt`] and then the text as it is
    /// generated through `on_event` (which breaks when nobody listens any more), and stops
    /// early when `cancel` is set. Errors about the request (e.g. a prompt too long) are
    /// returned as [`ApiError`]s.
    fn run(
        &mut self,
        job: &JobSpec,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
    ) -> Result<(Finish, Usage), ApiError>;

    /// Called after `run` panicked: drop any state the panic may have left half-written.
    fn recover(&mut self);

    /// What the prompt cache holds now (None: the backend has none).
    fn prompt_cache_stats(&mut self) -> Option<PromptCacheStats> {
        None
    }
}

struct Job {
    spec: JobSpec,
    cancel: Arc<AtomicBool>,
    events: UnboundedSender<Event>,
    submitted: Instant,
    log: Option<RequestLog>,
}

/// Where the worker reports what it measured.
struct Reporting {
    metrics: Arc<Metrics>,
    /// The worker's own stderr line per job (`--log-format text`).
    text_log: bool,
}

/// Sets the job's cancel flag when dropped: held by the request handler (or its response
/// stream), so a client that disconnects cancels its generation.
pub struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A queued job's events, and the guard that cancels it.
pub struct Ticket {
    pub events: UnboundedReceiver<Event>,
    /// Held only to be dropped with the ticket.
    pub _cancel: CancelOnDrop,
}

#[derive(Clone)]
pub struct Scheduler {
    jobs: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    /// Starts the worker thread; at most `queue_size` jobs wait behind the running one.
    #[cfg(test)]
    pub fn start(backend: impl Backend, queue_size: usize) -> Self {
        Self::start_reporting(backend, queue_size, Arc::new(Metrics::new()), true)
    }

    /// Starts the worker thread, counting into `metrics`; at most `queue_size` jobs wait
    /// behind the running one. `text_log`: the worker writes its line per job on stderr.
    pub fn start_reporting(
        mut backend: impl Backend,
        queue_size: usize,
        metrics: Arc<Metrics>,
        text_log: bool,
    ) -> Self {
        let (jobs, queue) = sync_channel::<Job>(queue_size);
        let reporting = Reporting {
            metrics: metrics.clone(),
            text_log,
        };
        std::thread::Builder::new()
            .name("generation".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    reporting.metrics.dequeued();
                    run_job(&mut backend, job, &reporting);
                }
            })
            .expect("spawning the generation thread");
        Self { jobs, metrics }
    }

    /// Queues `spec`; a 503 when the queue is full.
    #[cfg(test)]
    pub fn submit(&self, spec: JobSpec) -> Result<Ticket, ApiError> {
        self.submit_logged(spec, None)
    }

    /// Queues `spec` (a 503 when the queue is full), the worker's measurements going to the
    /// request's `log` too.
    pub fn submit_logged(
        &self,
        spec: JobSpec,
        log: Option<RequestLog>,
    ) -> Result<Ticket, ApiError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let (events, receiver) = unbounded_channel();
        let job = Job {
            spec,
            cancel: cancel.clone(),
            events,
            submitted: Instant::now(),
            log,
        };
        // Counted before the send: the worker may take the job up (and count it out) at once.
        self.metrics.queued();
        let sent = self.jobs.try_send(job);
        if sent.is_err() {
            self.metrics.dequeued();
        }
        match sent {
            Ok(()) => Ok(Ticket {
                events: receiver,
                _cancel: CancelOnDrop(cancel),
            }),
            Err(TrySendError::Full(_)) => Err(ApiError::overloaded(
                "the server is busy: the request queue is full (--queue-size); retry later",
            )),
            Err(TrySendError::Disconnected(_)) => {
                Err(ApiError::overloaded("the generation worker has stopped"))
            }
        }
    }
}

fn run_job(backend: &mut impl Backend, job: Job, reporting: &Reporting) {
    let taken = Instant::now();
    // A client that left while its job waited costs nothing.
    if job.cancel.load(Ordering::Relaxed) {
        if let Some(log) = &job.log {
            log.set_job(JobReport {
                finish: "cancelled",
                queued: taken - job.submitted,
                ..Default::default()
            });
        }
        return;
    }
    reporting.metrics.set_running(true);
    let delay = test_hooks::token_delay();
    let events = &job.events;
    let mut first_text: Option<Instant> = None;
    let mut on_event = |event: Event| {
        let is_text = matches!(event, Event::Text(_));
        if is_text && first_text.is_none() {
            first_text = Some(Instant::now());
        }
        if events.send(event).is_err() {
            return ControlFlow::Break(());
        }
        if let (true, Some(delay)) = (is_text, delay) {
            std::thread::sleep(delay);
        }
        ControlFlow::Continue(())
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        test_hooks::maybe_panic(&prompt_text(&job.spec.prompt));
        backend.run(&job.spec, &job.cancel, &mut on_event)
    }));
    let last = match outcome {
        Ok(Ok((finish, usage))) => Event::Done { finish, usage },
        Ok(Err(e)) => Event::Failed(e),
        Err(payload) => {
            backend.recover();
            let what = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Event::Failed(ApiError::internal(format!(
                "internal error during generation: {what}"
            )))
        }
    };
    let report = report(&job, &last, taken, first_text);
    reporting.metrics.count_generation(&report);
    if let Some(stats) = backend.prompt_cache_stats() {
        reporting.metrics.set_prompt_cache(&stats);
    }
    reporting.metrics.set_running(false);
    if reporting.text_log {
        log(&last);
    }
    if let Some(log) = &job.log {
        log.set_job(report);
    }
    let _ = job.events.send(last);
}

/// The job's measurements, from its last event and the time of its first text.
fn report(job: &Job, last: &Event, taken: Instant, first_text: Option<Instant>) -> JobReport {
    let end = Instant::now();
    let mut report = JobReport {
        queued: taken - job.submitted,
        time_to_first_token: first_text.map(|t| t - job.submitted),
        ..Default::default()
    };
    match last {
        Event::Done { finish, usage } => {
            report.finish = match finish {
                Finish::Stop => "stop",
                Finish::Length => "length",
                Finish::Cancelled => "cancelled",
            };
            report.usage = Some(*usage);
            let decoding = first_text.map(|t| (end - t).as_secs_f64());
            if let (Some(secs), true) = (decoding, usage.completion_tokens > 1) {
                if secs > 0.0 {
                    report.tokens_per_second = Some((usage.completion_tokens - 1) as f64 / secs);
                }
            }
        }
        Event::Failed(e) => {
            report.finish = "error";
            report.error = Some(e.message.clone());
        }
        _ => {}
    }
    report
}

/// One stderr line per request, as servers log them.
fn log(event: &Event) {
    let line = match event {
        Event::Done { finish, usage } => format!(
            "request: {} prompt tokens ({} cached), {} generated, {}",
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            match finish {
                Finish::Stop => "stop",
                Finish::Length => "length",
                Finish::Cancelled => "cancelled",
            }
        ),
        Event::Failed(e) => format!("request failed: {e}"),
        _ => return,
    };
    crate::ui::output::eprint_line(&line);
}

/// The prompt's text, for the test panic switch.
fn prompt_text(prompt: &Prompt) -> String {
    match prompt {
        Prompt::Text(text) => text.clone(),
        Prompt::Chat { messages, .. } => serde_json::to_string(messages).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::{PromptInfo, Sampling};
    use std::sync::Mutex;
    use std::time::Duration;

    /// Emits "a", "b", ... one piece per token until max_tokens or cancel; "panic" panics.
    struct Fake {
        started: Arc<Mutex<Vec<usize>>>,
        recovered: Arc<AtomicBool>,
        gate: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
    }

    impl Backend for Fake {
        fn run(
            &mut self,
            job: &JobSpec,
            cancel: &AtomicBool,
            on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
        ) -> Result<(Finish, Usage), ApiError> {
            self.started.lock().unwrap().push(job.max_tokens);
            if let Prompt::Text(t) = &job.prompt {
                if t == "panic" {
                    panic!("fake panic");
                }
                if t == "error" {
                    return Err(ApiError::invalid("fake error"));
                }
            }
            if let Some(gate) = &self.gate {
                let (lock, cv) = &**gate;
                let mut open = lock.lock().unwrap();
                while !*open {
                    open = cv.wait(open).unwrap();
                }
            }
            let _ = on_event(Event::Prompt(PromptInfo {
                prompt_tokens: 1,
                reasoning: crate::text::reasoning::ReasoningMode::Off,
                forced_opening: None,
            }));
            let mut n = 0;
            let finish = loop {
                if cancel.load(Ordering::Relaxed) {
                    break Finish::Cancelled;
                }
                if n == job.max_tokens {
                    break Finish::Length;
                }
                n += 1;
                if on_event(Event::Text(format!("{}", (b'a' + (n % 26) as u8) as char))).is_break()
                {
                    break Finish::Cancelled;
                }
            };
            Ok((
                finish,
                Usage {
                    prompt_tokens: 1,
                    cached_tokens: 0,
                    completion_tokens: n,
                },
            ))
        }

        fn recover(&mut self) {
            self.recovered.store(true, Ordering::Relaxed);
        }
    }

    fn spec(text: &str, max_tokens: usize) -> JobSpec {
        JobSpec {
            prompt: Prompt::Text(text.into()),
            max_tokens,
            sampling: Sampling {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.0,
                repetition_penalty: None,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                seed: None,
            },
            stop: vec![],
            logprobs: None,
            format: None,
        }
    }

    fn fake(
        gate: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
    ) -> (Fake, Arc<Mutex<Vec<usize>>>, Arc<AtomicBool>) {
        let started = Arc::new(Mutex::new(vec![]));
        let recovered = Arc::new(AtomicBool::new(false));
        (
            Fake {
                started: started.clone(),
                recovered: recovered.clone(),
                gate,
            },
            started,
            recovered,
        )
    }

    fn last_event(ticket: &mut Ticket) -> Event {
        let mut last = None;
        while let Some(e) = ticket.events.blocking_recv() {
            last = Some(e);
        }
        last.expect("no events")
    }

    #[test]
    fn jobs_run_in_order_and_finish() {
        let (backend, started, _) = fake(None);
        let scheduler = Scheduler::start(backend, 4);
        let mut a = scheduler.submit(spec("x", 3)).unwrap();
        let mut b = scheduler.submit(spec("x", 5)).unwrap();
        match last_event(&mut a) {
            Event::Done { finish, usage } => {
                assert_eq!(finish, Finish::Length);
                assert_eq!(usage.completion_tokens, 3);
            }
            e => panic!("{e:?}"),
        }
        assert!(
            matches!(last_event(&mut b), Event::Done { usage, .. } if usage.completion_tokens == 5)
        );
        assert_eq!(*started.lock().unwrap(), vec![3, 5]);
    }

    #[test]
    fn a_full_queue_is_503_and_a_panic_is_500_then_the_worker_goes_on() {
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let (backend, started, recovered) = fake(Some(gate.clone()));
        let scheduler = Scheduler::start(backend, 1);
        let mut running = scheduler.submit(spec("x", 2)).unwrap();
        // Wait until the worker took the first job (it then blocks on the gate), so that the
        // queue holds exactly the next one.
        while started.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut queued = scheduler.submit(spec("panic", 1)).unwrap();
        let full = scheduler
            .submit(spec("x", 1))
            .err()
            .expect("queue should be full");
        assert_eq!(full.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert!(matches!(last_event(&mut running), Event::Done { .. }));
        match last_event(&mut queued) {
            Event::Failed(e) => {
                assert_eq!(e.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
                assert!(e.message.contains("fake panic"), "{}", e.message);
            }
            e => panic!("{e:?}"),
        }
        assert!(recovered.load(Ordering::Relaxed));
        let mut after = scheduler.submit(spec("x", 2)).unwrap();
        assert!(matches!(last_event(&mut after), Event::Done { .. }));
    }

    #[test]
    fn dropping_the_ticket_cancels_the_generation() {
        let (backend, _, _) = fake(None);
        let scheduler = Scheduler::start(backend, 4);
        let mut ticket = scheduler.submit(spec("x", usize::MAX)).unwrap();
        // Read a few pieces, then hang up.
        let mut pieces = 0;
        while pieces < 3 {
            if let Some(Event::Text(_)) = ticket.events.blocking_recv() {
                pieces += 1;
            }
        }
        drop(ticket);
        // The worker is free again: the next job completes.
        let mut next = scheduler.submit(spec("x", 1)).unwrap();
        assert!(
            matches!(last_event(&mut next), Event::Done { usage, .. } if usage.completion_tokens == 1)
        );
    }

    #[test]
    fn errors_from_the_backend_reach_the_request() {
        let (backend, _, _) = fake(None);
        let scheduler = Scheduler::start(backend, 4);
        let mut ticket = scheduler.submit(spec("error", 1)).unwrap();
        assert!(
            matches!(last_event(&mut ticket), Event::Failed(e) if e.status == axum::http::StatusCode::BAD_REQUEST)
        );
    }
}
