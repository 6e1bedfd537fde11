//! Accepting connections, against slow and idle clients (axum::serve has no timeouts and no
//! cap, so the connections are served with hyper's HTTP/1 builder here):
//! - hyper's header-read timeout closes a connection whose request head has not arrived in
//!   full within `--header-timeout` (of its opening, or of the previous response);
//! - a kept-alive connection that starts no new request within `--keep-alive-timeout` of its
//!   last response is closed (keep_alive.rs); request bodies have their own timeout
//!   (body.rs);
//! - at most `--max-connections` are served in full (connection_cap.rs). Past that, a
//!   connection joins a small reserve where only `/health` is answered (anything else: 503,
//!   then close). When the reserve is full too, its oldest connection is closed to make room:
//!   a /health check is answered within milliseconds and leaves at once, so the oldest is
//!   almost always a slow client, and a flood of half-sent requests cannot shut out /health.

use super::connection_cap::ConnectionCap;
use super::keep_alive::Activity;
use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::AbortHandle;
use tower::ServiceExt;

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From a connection's opening (or its previous response) to the end of a request head.
    pub header: Duration,
    /// From the end of a response to the start of the next request on the connection.
    pub keep_alive: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open requests finish.
/// `health_only` answers the connections over the cap.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    health_only: Router,
    cap: ConnectionCap,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) {
    let full = Arc::new(Semaphore::new(cap.max));
    let reserve = Reserve::new(cap.health_reserve);
    // Connections watch `stop` for the shutdown and hold `open` until they end.
    let (stop, _) = watch::channel(false);
    let (open, _) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn = Connection {
            stream,
            timeouts,
            stop: stop.subscribe(),
            open: open.subscribe(),
        };
        match full.clone().try_acquire_owned() {
            Ok(slot) => {
                let app = app.clone();
                tokio::spawn(async move {
                    conn.serve(app, true).await;
                    drop(slot);
                });
            }
            Err(_) => reserve.admit(conn, health_only.clone()),
        }
    }
    let _ = stop.send(true);
    open.closed().await;
}

/// Accepting fails when the process is out of descriptors (the cap leaves room, but other
/// files count too) or a client gave up before it was accepted. Waiting a moment keeps the
/// loop from spinning while descriptors are short.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind;
    if !matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
    ) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Connection {
    stream: TcpStream,
    timeouts: Timeouts,
    stop: watch::Receiver<bool>,
    /// Held until the connection ends: the server waits for every one at shutdown.
    open: watch::Receiver<()>,
}

impl Connection {
    /// Serves HTTP/1 on the connection until the client leaves, a timeout closes it, or the
    /// server shuts down (then the request in progress is finished first).
    async fn serve(mut self, router: Router, keep_alive: bool) {
        let activity = Activity::new();
        let tracked = activity.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let router = router.clone();
            let guard = tracked.begin();
            async move {
                let response = router
                    .oneshot(request.map(Body::new))
                    .await
                    .unwrap_or_else(|never: Infallible| match never {});
                Ok::<_, Infallible>(response.map(|body| Activity::track(body, guard)))
            }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.timeouts.header)
            .keep_alive(keep_alive);
        let conn = builder.serve_connection(TokioIo::new(self.stream), service);
        tokio::pin!(conn);
        let idle = activity.idle_for(self.timeouts.keep_alive);
        tokio::pin!(idle);
        let (mut idle_closed, mut stopping) = (false, *self.stop.borrow());
        if stopping {
            conn.as_mut().graceful_shutdown();
        }
        loop {
            tokio::select! {
                _ = conn.as_mut() => break,
                () = &mut idle, if !idle_closed => {
                    idle_closed = true;
                    conn.as_mut().graceful_shutdown();
                }
                changed = self.stop.changed(), if !stopping => {
                    stopping = true;
                    if changed.is_err() || *self.stop.borrow() {
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
        drop(self.open);
    }
}

/// The connections over the cap, oldest first.
#[derive(Clone)]
struct Reserve(Arc<Mutex<ReserveState>>);

struct ReserveState {
    capacity: usize,
    next_id: u64,
    open: VecDeque<(u64, AbortHandle)>,
}

impl Reserve {
    fn new(capacity: usize) -> Self {
        Self(Arc::new(Mutex::new(ReserveState {
            capacity,
            next_id: 0,
            open: VecDeque::new(),
        })))
    }

    /// Serves `conn` with `health_only`, one request and no keep-alive, closing the oldest
    /// connection of the reserve when it is full.
    fn admit(&self, conn: Connection, health_only: Router) {
        // Held across the spawn, so the task cannot try to remove its entry before it is in.
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while state.open.len() >= state.capacity.max(1) {
            let Some((_, oldest)) = state.open.pop_front() else {
                break;
            };
            // Dropping its task closes the socket.
            oldest.abort();
        }
        let id = state.next_id;
        state.next_id += 1;
        let reserve = self.clone();
        let task = tokio::spawn(async move {
            conn.serve(health_only, false).await;
            let mut state = reserve.0.lock().unwrap_or_else(|p| p.into_inner());
            state.open.retain(|(i, _)| *i != id);
        });
        state.open.push_back((id, task.abort_handle()));
    }
}
