//! The idle timeout of a kept-alive connection (`--keep-alive-timeout`). hyper bounds the
//! time to read a request head (`--header-timeout`) but has no separate idle timeout, so each
//! connection counts its requests here: from the moment the last response has been sent in
//! full, a connection that starts no new request within the timeout is closed.

use axum::body::{Body, Bytes, HttpBody};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Copy, Default)]
struct Counts {
    in_flight: usize,
    finished: u64,
}

/// The requests of one connection.
#[derive(Clone)]
pub struct Activity(Arc<watch::Sender<Counts>>);

impl Activity {
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(Counts::default())))
    }

    /// A request has begun; it ends when the returned guard is dropped (with the response
    /// body, see [`Activity::track`]).
    pub fn begin(&self) -> RequestGuard {
        self.0.send_modify(|c| c.in_flight += 1);
        RequestGuard(self.0.clone())
    }

    /// `body`, holding `guard` until hyper has sent all of it (or dropped it).
    pub fn track(body: Body, guard: RequestGuard) -> Body {
        Body::new(TrackedBody {
            inner: body,
            _guard: guard,
        })
    }

    /// Resolves once a request has been answered and no other has begun for `timeout`.
    pub async fn idle_for(&self, timeout: Duration) {
        let mut counts = self.0.subscribe();
        loop {
            let now = *counts.borrow_and_update();
            let idle = now.in_flight == 0 && now.finished > 0;
            if idle {
                match tokio::time::timeout(timeout, counts.changed()).await {
                    Err(_elapsed) => return,
                    Ok(_) => continue,
                }
            }
            // The sender lives as long as `self`: `changed` cannot fail here.
            let _ = counts.changed().await;
        }
    }
}

pub struct RequestGuard(Arc<watch::Sender<Counts>>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.send_modify(|c| {
            c.in_flight -= 1;
            c.finished += 1;
        });
    }
}

/// A response body that keeps its request counted as in flight while it is being sent (a
/// streamed reply runs long after the handler has returned).
struct TrackedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
