//! The accept loop: what a connection may cost the host.
//!
//! - at most `max_connections` open, and `max_connections_per_client` from one address; a
//!   connection past either is closed at once (the descriptors stay for everyone else);
//! - a request's headers must arrive within `header_timeout` (also the wait for the next request
//!   on a kept-alive connection), and its head (request line and headers) is at most
//!   [`MAX_HEAD`] (431 past it): hyper buffers a head as it arrives, before anyone is known, up
//!   to 400 KiB per connection unless told; handlers read bodies within `body_timeout`;
//! - a response that the client does not read for `idle_timeout` ends the connection;
//! - on shutdown, no new connection is accepted, idle ones are closed, and requests in flight
//!   finish (each within its deadline) within `shutdown_timeout`, when the connections still
//!   open are closed.

use crate::policy::HttpSettings;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// How long the loop pauses when `accept` fails (out of descriptors): the failure would repeat
/// at once, and spinning on it would take a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Largest request head a connection buffers (hyper's read buffer, and its write queue's
/// threshold): every request of the API has a head of well under 1 KiB and a token.
pub const MAX_HEAD: usize = 64 << 10;

/// Open connections, in all and per client address, and those with no request in flight
/// (waiting for a request's head: the first, or the next on a kept-alive connection).
///
/// When every connection is taken, a new one closes the oldest of those waiting: without a
/// request in flight it holds nothing but its socket, and clients from many addresses (an
/// IPv6 prefix has billions), each within `max_connections_per_client`, could otherwise hold
/// every connection with half-sent heads, renewed every `header_timeout`, and keep every
/// tenant out. A request's connection is never closed for another.
#[derive(Debug, Default)]
pub struct Connections {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    open: usize,
    per_client: HashMap<IpAddr, usize>,
    /// Connections with no request in flight, oldest first, and how to close each.
    waiting: BTreeMap<u64, Arc<tokio::sync::Notify>>,
    next: u64,
}

/// One connection's place: whether a request of it is in flight, and its close signal.
#[derive(Debug)]
struct Place {
    conns: Arc<Connections>,
    id: u64,
    close: Arc<tokio::sync::Notify>,
}

impl Place {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.conns
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A request's head arrived: the connection is not closed for another until its response
    /// is sent.
    fn busy(&self) {
        self.state().waiting.remove(&self.id);
    }

    /// Its response was sent (or dropped): it waits for the next head, and may be closed for
    /// a new connection. Not if it is gone.
    fn waiting(&self, open: &std::sync::atomic::AtomicBool) {
        let mut s = self.state();
        if open.load(std::sync::atomic::Ordering::Relaxed) {
            s.waiting.insert(self.id, Arc::clone(&self.close));
        }
    }
}

/// A connection counted while it is open.
#[derive(Debug)]
pub struct Counted {
    place: Arc<Place>,
    ip: IpAddr,
    /// False once the connection is gone (a response body dropped after it must not make it
    /// waiting again).
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut s = self.place.state();
        self.open.store(false, std::sync::atomic::Ordering::Relaxed);
        s.open -= 1;
        s.waiting.remove(&self.place.id);
        if let Some(n) = s.per_client.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                s.per_client.remove(&self.ip);
            }
        }
    }
}

impl Counted {
    /// Resolves when the connection is closed to make room for a new one.
    pub async fn closed(&self) {
        self.place.close.notified().await;
    }
}

impl Connections {
    /// Counts a new connection from `ip`, unless it would go over its client's cap; when all
    /// `max` are open, it closes the oldest one with no request in flight to make room, and is
    /// refused if every one has a request in flight. (Until that one's task ends, a moment
    /// later, one more than `max` is counted.)
    pub fn enter(self: &Arc<Self>, ip: IpAddr, max: usize, per_client: usize) -> Option<Counted> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = s.per_client.get(&ip).copied().unwrap_or(0);
        if mine >= per_client {
            return None;
        }
        if s.open >= max {
            let (_, close) = s.waiting.pop_first()?;
            close.notify_one();
        }
        s.open += 1;
        *s.per_client.entry(ip).or_default() += 1;
        let id = s.next;
        s.next += 1;
        let close = Arc::new(tokio::sync::Notify::new());
        s.waiting.insert(id, Arc::clone(&close));
        Some(Counted {
            place: Arc::new(Place {
                conns: Arc::clone(self),
                id,
                close,
            }),
            ip,
            open: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
    }
}

/// The router for one connection: marks it busy from a request's head to the end of its
/// response's body (when hyper drops it), so that it is never closed for another meanwhile.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    place: Arc<Place>,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Tracked {
    type Response = hyper::Response<axum::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        use http_body_util::BodyExt;
        self.place.busy();
        let answered = self.inner.call(req);
        let done = Sent {
            place: Arc::clone(&self.place),
            open: Arc::clone(&self.open),
        };
        Box::pin(async move {
            let resp = answered.await?;
            Ok(resp.map(|body| {
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _held = &done;
                    frame
                }))
            }))
        })
    }
}

/// Dropped with a response's body: its connection waits for the next request.
struct Sent {
    place: Arc<Place>,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.place.waiting(&self.open);
    }
}

/// A stream whose writes fail once they have made no progress for `timeout`: a client that
/// stops reading its response cannot hold the connection and the response's memory.
struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteTimeout<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// A write or flush that completed resets the clock; one that could not progress runs it.
    fn progressed<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.stalled(cx).map(Err),
        }
    }

    /// Called when a write cannot progress: fails once it has not for `timeout`.
    fn stalled(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing of the response for too long",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(cx, polled)
    }

    // Vectored writes: hyper then queues a response's chunks as they are (an output of
    // hundreds of MB is not copied into its write buffer) and writes them with `writev`.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => self.stalled(cx).map(Err),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets requests in flight
/// finish for as long as it answers (the policy's `shutdown_timeout` in force at the stop) and
/// closes the connections still open. `conns` counts open connections (for metrics and tests).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: HttpSettings,
    conns: Arc<Connections>,
    shutdown: impl Future<Output = Duration>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let drain = loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            drain = &mut shutdown => break drain,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(counted) = conns.enter(
            addr.ip(),
            settings.max_connections,
            settings.max_connections_per_client,
        ) else {
            drop(stream);
            continue;
        };
        let conn = connection(stream, router.clone(), &settings, &counted);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                // Dropping the connection closes its socket.
                () = counted.closed() => {}
            }
            drop(counted);
        });
    };
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "{} connection(s) still open {drain:?} after the stop began (host.shutdown_timeout): closing them",
            conns.open(),
        );
    }
}

fn connection(
    stream: TcpStream,
    router: Router,
    settings: &HttpSettings,
    counted: &Counted,
) -> hyper::server::conn::http1::Connection<TokioIo<WriteTimeout<TcpStream>>, Tracked> {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(WriteTimeout::new(stream, settings.idle_timeout));
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_buf_size(MAX_HEAD)
        .keep_alive(true)
        .serve_connection(
            io,
            Tracked {
                inner: TowerToHyperService::new(router),
                place: Arc::clone(&counted.place),
                open: Arc::clone(&counted.open),
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_per_client_and_the_oldest_waiting_makes_room() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let a1 = c.enter(a, 3, 2).expect("first");
        let a2 = c.enter(a, 3, 2).expect("second");
        assert!(c.enter(a, 3, 2).is_none(), "per client");
        let b1 = c.enter(b, 3, 2).expect("another client");
        // All three taken; a1 and b1 have requests in flight, a2 waits for its head: it is
        // closed for the newcomer.
        a1.place.busy();
        b1.place.busy();
        let b2 = c.enter(b, 3, 2).expect("room made");
        let closed = a2.closed();
        futures_now(closed);
        drop(a2);
        assert_eq!(c.open(), 3);
        // Every one in flight: refused.
        b2.place.busy();
        assert!(c.enter(b, 3, 3).is_none(), "all in flight");
        // A response sent: that connection waits again, and is the one closed.
        b1.place.waiting(&b1.open);
        let _b3 = c.enter(b, 3, 3).expect("room made again");
        futures_now(b1.closed());
        drop(a1);
    }

    /// Polls `f` once: it must be ready.
    fn futures_now(f: impl Future<Output = ()>) {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(f.as_mut().poll(&mut cx).is_ready(), "not closed");
    }

    #[tokio::test]
    async fn vectored_writes_pass_through_and_stall_out() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let mut w = WriteTimeout::new(server, Duration::from_millis(200));
        // Else hyper copies every response chunk into one flat buffer before writing it.
        assert!(w.is_write_vectored());
        let chunk = vec![7u8; 1 << 20];
        let started = std::time::Instant::now();
        let stalled = loop {
            let bufs = [std::io::IoSlice::new(&chunk), std::io::IoSlice::new(&chunk)];
            match tokio::time::timeout(Duration::from_secs(10), w.write_vectored(&bufs)).await {
                Ok(Ok(n)) => assert!(n > 0),
                Ok(Err(e)) => break e,
                Err(_) => panic!("a write the client never reads did not stall out"),
            }
        };
        assert_eq!(stalled.kind(), std::io::ErrorKind::TimedOut, "{stalled}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        drop(client);
    }
}
