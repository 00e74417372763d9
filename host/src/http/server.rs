//! The accept loop: what a connection may cost the host.
//!
//! - at most `max_connections` open, and `max_connections_per_client` from one address; a
//!   connection past its client's cap closes one of that client's, and one past
//!   `max_connections` one of anyone's, that carries no tenant's request (`conns.rs`), or is
//!   closed at once when it cannot (the descriptors stay for everyone else);
//! - a request's headers must arrive within `header_timeout` (also the wait for the next request
//!   on a kept-alive connection), and its head (request line and headers) is at most
//!   [`MAX_HEAD`] (431 past it): hyper buffers a head as it arrives, before anyone is known, up
//!   to 400 KiB per connection unless told; handlers read bodies within `body_timeout`;
//! - a response that the client does not read for `idle_timeout` ends the connection;
//! - on shutdown, no new connection is accepted, idle ones are closed, and requests in flight
//!   finish (each within its deadline) within `shutdown_timeout`, when the connections still
//!   open are closed.

pub use crate::http::conns::Connections;
use crate::http::conns::{Carried, Counted, Track};
use crate::policy::HttpSettings;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// How long the loop pauses when `accept` fails (out of descriptors): the failure would repeat
/// at once, and spinning on it would take a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Largest request head a connection buffers (hyper's read buffer, and its write queue's
/// threshold; hyper's least is 8 KiB): every request of the API has a head of well under 1 KiB
/// and a token. Every connection, before anyone is known, may hold this much for its header
/// timeout: at 64 KiB, a host's 1,024 connections held 64 MiB of unfinished heads. (It also
/// bounds hyper's reads of a body: a 4 MiB invoke body is read 16 KiB at a time.)
pub const MAX_HEAD: usize = 16 << 10;

/// The router for one connection: each request carries the connection ([`Carried`]), which
/// its authentication makes busy until its response is sent (`http/conns.rs`).
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    track: Track,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Tracked {
    type Response = hyper::Response<axum::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, mut req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let carried = Carried::new(self.track.clone());
        req.extensions_mut().insert(carried.clone());
        let answered = self.inner.call(req);
        Box::pin(async move { Ok(carried.respond(answered.await?)) })
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
                track: counted.track(),
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

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
