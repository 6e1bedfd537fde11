//! The generation worker: a thread owns the model (and with it the prompt cache, shared by
//! all requests) and runs up to `max_batch` jobs together, taken first come, first served
//! from a bounded queue (a full queue is a 503). A job joins the running ones between two
//! steps and leaves at the step it ends in; each step is one piece of a waiting prompt's
//! prefill and one decode step of every running job (the backend's batch). Each job carries
//! a cancel flag that its request sets when it is dropped (the client went away); the
//! backend checks it at every step and frees the job's place.
//! A request asking for `n` choices is queued as one entry and admitted as `n` jobs at once
//! (when there is room for all of them), which the backend runs from one prefill of the
//! prompt; each choice has its own events, cancel flag and end.
//! A panic while a job is admitted fails that job with 500; a panic in a step that the
//! backend did not isolate fails the jobs running in it with 500 (their states may be
//! half-written). The worker keeps serving.
//! The worker measures each job (queueing, time to first token, decode speed) for /metrics
//! and the request log.

use super::error::ApiError;
use super::job::{Event, Finish, JobReport, JobSpec, Prompt, Usage};
use super::metrics::{Metrics, PromptCacheStats};
use super::request_log::RequestLog;
use super::test_hooks;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// A job's name while it runs.
pub type JobId = u64;

/// How a job ended: its finish and usage, or the error that failed it.
pub type JobResult = Result<(Finish, Usage), ApiError>;

/// What runs jobs on the device, several at a time: the engine in the server, a fake in
/// unit tests.
pub trait Backend: Send + 'static {
    /// Takes `job` up as `choices` (its id and output per choice; one unless the request
    /// asked for `n`): renders and tokenizes the prompt and sends [`Event::Prompt`] through
    /// each output. `Ok(None)`: the choices now run, each one's text going to its output at
    /// each [`Backend::step`] until one of them reports its end. `Ok(Some(_))`: they ended
    /// already. Errors about the request (e.g. a prompt too long) are [`ApiError`]s.
    fn admit(
        &mut self,
        job: &JobSpec,
        choices: Vec<(JobId, JobOutput)>,
    ) -> Result<Option<(Finish, Usage)>, ApiError>;

    /// One step of the running jobs; returns those that ended in it (a job whose output's
    /// reader is gone ends at the next step at the latest).
    fn step(&mut self) -> Vec<(JobId, JobResult)>;

    /// Called after a panic: drop any state the panic may have left half-written; with
    /// `running`, the running jobs too (a step panicked), whose ids it returns.
    fn recover(&mut self, running: bool) -> Vec<JobId>;

    /// What the prompt cache holds now (None: the backend has none).
    fn prompt_cache_stats(&mut self) -> Option<PromptCacheStats> {
        None
    }
}

/// Where a running job's events go.
#[derive(Clone)]
pub struct JobOutput {
    events: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    first_text: Arc<OnceLock<Instant>>,
    /// The test switch that slows each piece of text.
    delay: Option<Duration>,
}

impl JobOutput {
    /// Sends `event`; `Break` when nobody listens any more.
    pub fn send(&self, event: Event) -> ControlFlow<()> {
        let is_text = matches!(event, Event::Text(_));
        if is_text {
            self.first_text.get_or_init(Instant::now);
        }
        if self.events.send(event).is_err() {
            return ControlFlow::Break(());
        }
        if let (true, Some(delay)) = (is_text, self.delay) {
            std::thread::sleep(delay);
        }
        ControlFlow::Continue(())
    }

    /// The client went away.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// A queued request: its job and the channel of each of its choices.
struct Job {
    spec: JobSpec,
    choices: Vec<Channel>,
    submitted: Instant,
    log: Option<RequestLog>,
}

/// Where one choice's events go, and its cancel flag.
struct Channel {
    cancel: Arc<AtomicBool>,
    events: UnboundedSender<Event>,
}

/// A choice the worker took up.
struct Taken {
    channel: Channel,
    submitted: Instant,
    taken: Instant,
    first_text: Arc<OnceLock<Instant>>,
    /// The request's log, kept by its first choice.
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
    /// Starts the worker thread: at most `max_batch` jobs run together, `queue_size` more
    /// wait.
    #[cfg(test)]
    pub fn start(backend: impl Backend, max_batch: usize, queue_size: usize) -> Self {
        Self::start_reporting(
            backend,
            max_batch,
            queue_size,
            Arc::new(Metrics::new()),
            true,
        )
    }

    /// Starts the worker thread, counting into `metrics`: at most `max_batch` jobs run
    /// together, `queue_size` more wait. `text_log`: the worker writes its line per job on
    /// stderr.
    pub fn start_reporting(
        backend: impl Backend,
        max_batch: usize,
        queue_size: usize,
        metrics: Arc<Metrics>,
        text_log: bool,
    ) -> Self {
        let (jobs, queue) = sync_channel::<Job>(queue_size);
        let reporting = Reporting {
            metrics: metrics.clone(),
            text_log,
        };
        let worker = Worker {
            backend,
            queue,
            max_batch: max_batch.max(1),
            running: HashMap::new(),
            waiting: None,
            next_id: 0,
            reporting,
        };
        std::thread::Builder::new()
            .name("generation".into())
            .spawn(move || worker.run())
            .expect("spawning the generation thread");
        Self { jobs, metrics }
    }

    /// Queues `spec`; a 503 when the queue is full.
    #[cfg(test)]
    pub fn submit(&self, spec: JobSpec) -> Result<Ticket, ApiError> {
        let mut tickets = self.submit_choices(spec, 1, None)?;
        Ok(tickets.pop().expect("one ticket"))
    }

    /// Queues `spec` for `n` choices, admitted together (a 503 when the queue is full): a
    /// ticket per choice; the worker's measurements of the first go to the request's `log`
    /// too.
    pub fn submit_choices(
        &self,
        spec: JobSpec,
        n: usize,
        log: Option<RequestLog>,
    ) -> Result<Vec<Ticket>, ApiError> {
        let (mut choices, mut tickets) = (vec![], vec![]);
        for _ in 0..n.max(1) {
            let cancel = Arc::new(AtomicBool::new(false));
            let (events, receiver) = unbounded_channel();
            choices.push(Channel {
                cancel: cancel.clone(),
                events,
            });
            tickets.push(Ticket {
                events: receiver,
                _cancel: CancelOnDrop(cancel),
            });
        }
        let job = Job {
            spec,
            choices,
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
            Ok(()) => Ok(tickets),
            Err(TrySendError::Full(_)) => Err(ApiError::overloaded(
                "the server is busy: the request queue is full (--queue-size); retry later",
            )),
            Err(TrySendError::Disconnected(_)) => {
                Err(ApiError::overloaded("the generation worker has stopped"))
            }
        }
    }
}

struct Worker<B> {
    backend: B,
    queue: Receiver<Job>,
    max_batch: usize,
    running: HashMap<JobId, Taken>,
    /// A request taken from the queue whose choices wait for room in the batch (it goes
    /// first, before the queue).
    waiting: Option<Job>,
    next_id: JobId,
    reporting: Reporting,
}

impl<B: Backend> Worker<B> {
    fn run(mut self) {
        loop {
            // New jobs join between steps while there is room; an idle worker waits for one.
            while self.running.len() < self.max_batch {
                let job = match (self.waiting.take(), self.running.is_empty()) {
                    (Some(job), _) => job,
                    (None, true) => match self.queue.recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    },
                    (None, false) => match self.queue.try_recv() {
                        Ok(job) => job,
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    },
                };
                // A request's choices join together: it waits (first in line) for room for
                // all. The requests validate n ≤ max_batch, so an empty batch has room.
                let room = self.max_batch - self.running.len();
                if job.choices.len() > room && !self.running.is_empty() {
                    self.waiting = Some(job);
                    break;
                }
                self.reporting.metrics.dequeued();
                self.admit(job);
            }
            self.reporting.metrics.set_running(self.running.len());
            if self.running.is_empty() {
                continue;
            }
            let ended = catch_unwind(AssertUnwindSafe(|| self.backend.step()));
            let ended = match ended {
                Ok(ended) => ended,
                Err(payload) => {
                    let error = panic_error(payload);
                    let failed = self.backend.recover(true);
                    failed
                        .into_iter()
                        .map(|id| (id, Err(error.clone())))
                        .collect()
                }
            };
            // The gauge drops before the ended jobs' last events go out: a client that reads
            // /metrics after its reply sees itself no longer running.
            let ended: Vec<_> = (ended.into_iter())
                .filter_map(|(id, result)| Some((self.running.remove(&id)?, result)))
                .collect();
            self.reporting.metrics.set_running(self.running.len());
            for (taken, result) in ended {
                self.end(taken, result);
            }
        }
    }

    fn admit(&mut self, job: Job) {
        let taken = Instant::now();
        // A client that left while its job waited costs nothing.
        if job.choices.iter().all(|c| c.cancel.load(Ordering::Relaxed)) {
            if let Some(log) = &job.log {
                log.set_job(JobReport {
                    finish: "cancelled",
                    queued: taken - job.submitted,
                    ..Default::default()
                });
            }
            return;
        }
        let Job {
            spec,
            choices,
            submitted,
            mut log,
        } = job;
        let mut outputs = vec![];
        let mut choices: Vec<(JobId, Taken)> = choices
            .into_iter()
            .map(|channel| {
                let id = self.next_id;
                self.next_id += 1;
                let first_text = Arc::new(OnceLock::new());
                outputs.push((
                    id,
                    JobOutput {
                        events: channel.events.clone(),
                        cancel: channel.cancel.clone(),
                        first_text: first_text.clone(),
                        delay: test_hooks::token_delay(),
                    },
                ));
                let taken = Taken {
                    channel,
                    submitted,
                    taken,
                    first_text,
                    log: log.take(),
                };
                (id, taken)
            })
            .collect();
        let admitted = catch_unwind(AssertUnwindSafe(|| {
            test_hooks::maybe_panic(&prompt_text(&spec.prompt));
            self.backend.admit(&spec, outputs)
        }));
        let result = match admitted {
            Ok(Ok(None)) => {
                self.running.extend(choices);
                return;
            }
            Ok(Ok(Some(ended))) => Ok(ended),
            Ok(Err(e)) => Err(e),
            Err(payload) => {
                self.backend.recover(false);
                Err(panic_error(payload))
            }
        };
        for (_, taken) in choices.drain(..) {
            self.end(taken, result.clone());
        }
    }

    /// Reports a job's end and sends its last event.
    fn end(&mut self, taken: Taken, result: JobResult) {
        let last = match result {
            Ok((finish, usage)) => Event::Done { finish, usage },
            Err(e) => Event::Failed(e),
        };
        let report = report(&taken, &last);
        let reporting = &self.reporting;
        reporting.metrics.count_generation(&report);
        if let Some(stats) = self.backend.prompt_cache_stats() {
            reporting.metrics.set_prompt_cache(&stats);
        }
        if reporting.text_log {
            log(&last);
        }
        if let Some(log) = &taken.log {
            log.set_job(report);
        }
        let _ = taken.channel.events.send(last);
    }
}

/// The 500 for a panic on the worker.
fn panic_error(payload: Box<dyn std::any::Any + Send>) -> ApiError {
    let what = crate::engine::panic_message(payload.as_ref());
    ApiError::internal(format!("internal error during generation: {what}"))
}

/// The job's measurements, from its last event and the time of its first text.
fn report(taken: &Taken, last: &Event) -> JobReport {
    let end = Instant::now();
    let first_text = taken.first_text.get().copied();
    let mut report = JobReport {
        queued: taken.taken - taken.submitted,
        time_to_first_token: first_text.map(|t| t - taken.submitted),
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
            "request: {} prompt tokens ({} cached), {} generated{}, {}",
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            usage.drafts.map_or(String::new(), |d| format!(
                " ({}/{} draft tokens accepted in {} verify steps)",
                d.accepted, d.proposed, d.steps
            )),
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

/// The prompt's text, for the test panic switches.
pub fn prompt_text(prompt: &Prompt) -> String {
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

    /// Emits "b", "c", ... one piece per job and step until max_tokens or cancel; "panic"
    /// panics when admitted, "step-panic" at its first step; "error" is refused.
    struct Fake {
        started: Arc<Mutex<Vec<usize>>>,
        recovered: Arc<AtomicBool>,
        gate: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
        /// Running jobs: (id, max_tokens, generated, output, panics).
        running: Vec<(JobId, usize, usize, JobOutput, bool)>,
        /// The most jobs seen running in one step.
        widest: Arc<Mutex<usize>>,
    }

    impl Backend for Fake {
        fn admit(
            &mut self,
            job: &JobSpec,
            choices: Vec<(JobId, JobOutput)>,
        ) -> Result<Option<(Finish, Usage)>, ApiError> {
            self.started.lock().unwrap().push(job.max_tokens);
            let text = match &job.prompt {
                Prompt::Text(t) => t.clone(),
                _ => String::new(),
            };
            if text == "panic" {
                panic!("fake panic");
            }
            if text == "error" {
                return Err(ApiError::invalid("fake error"));
            }
            for (id, output) in choices {
                let _ = output.send(Event::Prompt(PromptInfo {
                    prompt_tokens: 1,
                    reasoning: crate::text::reasoning::ReasoningMode::Off,
                    forced_opening: None,
                }));
                self.running
                    .push((id, job.max_tokens, 0, output, text == "step-panic"));
            }
            Ok(None)
        }

        fn step(&mut self) -> Vec<(JobId, JobResult)> {
            if let Some(gate) = &self.gate {
                let (lock, cv) = &**gate;
                let mut open = lock.lock().unwrap();
                while !*open {
                    open = cv.wait(open).unwrap();
                }
            }
            {
                let mut widest = self.widest.lock().unwrap();
                *widest = (*widest).max(self.running.len());
            }
            if self.running.iter().any(|r| r.4) {
                panic!("fake step panic");
            }
            let mut ended = vec![];
            self.running.retain_mut(|(id, max, n, output, _)| {
                let finish = if output.cancelled() {
                    Some(Finish::Cancelled)
                } else if *n == *max {
                    Some(Finish::Length)
                } else {
                    *n += 1;
                    let piece = format!("{}", (b'a' + (*n % 26) as u8) as char);
                    output
                        .send(Event::Text(piece))
                        .is_break()
                        .then_some(Finish::Cancelled)
                };
                let usage = Usage {
                    prompt_tokens: 1,
                    cached_tokens: 0,
                    completion_tokens: *n,
                    ..Usage::default()
                };
                match finish {
                    Some(finish) => {
                        ended.push((*id, Ok((finish, usage))));
                        false
                    }
                    None => true,
                }
            });
            ended
        }

        fn recover(&mut self, running: bool) -> Vec<JobId> {
            self.recovered.store(true, Ordering::Relaxed);
            match running {
                true => self.running.drain(..).map(|r| r.0).collect(),
                false => vec![],
            }
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

    struct Probes {
        started: Arc<Mutex<Vec<usize>>>,
        recovered: Arc<AtomicBool>,
        widest: Arc<Mutex<usize>>,
    }

    fn fake(gate: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>) -> (Fake, Probes) {
        let probes = Probes {
            started: Arc::new(Mutex::new(vec![])),
            recovered: Arc::new(AtomicBool::new(false)),
            widest: Arc::new(Mutex::new(0)),
        };
        (
            Fake {
                started: probes.started.clone(),
                recovered: probes.recovered.clone(),
                gate,
                running: vec![],
                widest: probes.widest.clone(),
            },
            probes,
        )
    }

    /// The job's text and its last event.
    fn finish(ticket: &mut Ticket) -> (String, Event) {
        let (mut text, mut last) = (String::new(), None);
        while let Some(e) = ticket.events.blocking_recv() {
            if let Event::Text(t) = &e {
                text.push_str(t);
            }
            last = Some(e);
        }
        (text, last.expect("no events"))
    }

    fn last_event(ticket: &mut Ticket) -> Event {
        finish(ticket).1
    }

    fn gate() -> Arc<(Mutex<bool>, std::sync::Condvar)> {
        Arc::new((Mutex::new(false), std::sync::Condvar::new()))
    }

    fn open(gate: &Arc<(Mutex<bool>, std::sync::Condvar)>) {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }

    #[test]
    fn jobs_run_together_up_to_max_batch_and_each_gets_its_own_text() {
        let gate = gate();
        let (backend, probes) = fake(Some(gate.clone()));
        let scheduler = Scheduler::start(backend, 2, 4);
        let mut tickets: Vec<Ticket> = [3, 5, 2]
            .iter()
            .map(|&n| scheduler.submit(spec("x", n)).unwrap())
            .collect();
        open(&gate);
        let expected = ["bcd", "bcdef", "bc"];
        for (ticket, want) in tickets.iter_mut().zip(expected) {
            let (text, last) = finish(ticket);
            assert_eq!(text, want);
            match last {
                Event::Done { finish, usage } => {
                    assert_eq!(finish, Finish::Length);
                    assert_eq!(usage.completion_tokens, want.len());
                }
                e => panic!("{e:?}"),
            }
        }
        assert_eq!(*probes.started.lock().unwrap(), vec![3, 5, 2]);
        assert_eq!(
            *probes.widest.lock().unwrap(),
            2,
            "never more than --max-batch"
        );
    }

    /// A scheduler of `max_batch` running a job that never ends by itself, once its text
    /// comes.
    fn running_a_long_job(max_batch: usize) -> (Scheduler, Ticket, Probes) {
        let (backend, probes) = fake(None);
        let scheduler = Scheduler::start(backend, max_batch, 4);
        let mut long = scheduler.submit(spec("x", usize::MAX)).unwrap();
        while !matches!(long.events.blocking_recv(), Some(Event::Text(_))) {}
        (scheduler, long, probes)
    }

    #[test]
    fn a_job_joins_while_others_run() {
        // The long job runs; a second one joins it, ends, and the long one goes on.
        let (scheduler, long, probes) = running_a_long_job(4);
        let mut short = scheduler.submit(spec("x", 3)).unwrap();
        assert!(
            matches!(last_event(&mut short), Event::Done { usage, .. } if usage.completion_tokens == 3)
        );
        assert_eq!(*probes.widest.lock().unwrap(), 2);
        drop(long);
    }

    #[test]
    fn a_requests_choices_wait_for_room_for_all_then_run_together() {
        let (scheduler, long, probes) = running_a_long_job(3);
        // Two more fit beside the long one; three wait until it leaves.
        let mut two = scheduler.submit_choices(spec("x", 4), 2, None).unwrap();
        let mut three = scheduler.submit_choices(spec("x", 3), 3, None).unwrap();
        for ticket in &mut two {
            assert_eq!(finish(ticket).0, "bcde");
        }
        assert_eq!(*probes.widest.lock().unwrap(), 3);
        assert_eq!(*probes.started.lock().unwrap(), vec![usize::MAX, 4]);
        drop(long);
        for ticket in &mut three {
            assert_eq!(finish(ticket).0, "bcd");
        }
        assert_eq!(
            *probes.widest.lock().unwrap(),
            3,
            "never more than --max-batch"
        );
        assert_eq!(*probes.started.lock().unwrap(), vec![usize::MAX, 4, 3]);
    }

    #[test]
    fn a_full_queue_is_503_and_a_panic_is_500_then_the_worker_goes_on() {
        let gate = gate();
        let (backend, probes) = fake(Some(gate.clone()));
        let scheduler = Scheduler::start(backend, 1, 1);
        let mut running = scheduler.submit(spec("x", 2)).unwrap();
        // Wait until the worker took the first job (its step then blocks on the gate), so
        // that the queue holds exactly the next one.
        while probes.started.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut queued = scheduler.submit(spec("panic", 1)).unwrap();
        let full = scheduler
            .submit(spec("x", 1))
            .err()
            .expect("queue should be full");
        assert_eq!(full.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        open(&gate);
        assert!(matches!(last_event(&mut running), Event::Done { .. }));
        match last_event(&mut queued) {
            Event::Failed(e) => {
                assert_eq!(e.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
                assert!(e.message.contains("fake panic"), "{}", e.message);
            }
            e => panic!("{e:?}"),
        }
        assert!(probes.recovered.load(Ordering::Relaxed));
        let mut after = scheduler.submit(spec("x", 2)).unwrap();
        assert!(matches!(last_event(&mut after), Event::Done { .. }));
    }

    #[test]
    fn a_panic_in_a_step_fails_the_jobs_in_it_and_the_worker_goes_on() {
        let (backend, _) = fake(None);
        let scheduler = Scheduler::start(backend, 4, 4);
        let mut bad = scheduler.submit(spec("step-panic", 3)).unwrap();
        assert!(
            matches!(last_event(&mut bad), Event::Failed(e) if e.message.contains("fake step panic"))
        );
        let mut after = scheduler.submit(spec("x", 2)).unwrap();
        assert!(matches!(last_event(&mut after), Event::Done { .. }));
    }

    #[test]
    fn dropping_the_ticket_cancels_the_generation() {
        let (backend, _) = fake(None);
        let scheduler = Scheduler::start(backend, 1, 4);
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
        let (backend, _) = fake(None);
        let scheduler = Scheduler::start(backend, 4, 4);
        let mut ticket = scheduler.submit(spec("error", 1)).unwrap();
        assert!(
            matches!(last_event(&mut ticket), Event::Failed(e) if e.status == axum::http::StatusCode::BAD_REQUEST)
        );
    }
}
