//! `POST /v1/invoke/{function}`: JSON invocation in, safetensors out, timings in
//! `Server-Timing`.

use crate::Host;
use crate::account::{Reaper, Usage};
use crate::http::conns::Held;
use crate::http::errors::ApiError;
use crate::http::extract::{self, Authed, Name};
use crate::metrics::{CLIENT_CLOSED, Observation};
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use hapi_wire::invoke::MAX_INVOKE_BODY;
use hapi_wire::{ErrorCode, InvokeRequest, ServerTiming, Stage};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

pub async fn invoke(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Name(function): Name,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    // An invocation answered before it runs is counted as refused (its function's name is
    // the client's, so it is not a label).
    let refused = ApiError::counted(&host.metrics, &tenant.name, "invoke");
    let declared = extract::declared_within(&headers, MAX_INVOKE_BODY).map_err(refused)?;
    let timeout = host.policy().host.http.body_timeout;
    // Looked up again once admitted; none is held while the call waits.
    if host.function(&tenant.name, &function).is_none() {
        let missing = ApiError::new(
            ErrorCode::FunctionNotFound,
            format!("tenant `{}` has no function `{function}`", tenant.name),
        );
        return extract::refuse(body, MAX_INVOKE_BODY, timeout, missing)
            .await
            .map_err(refused);
    }
    // Admitted before the body is read: a tenant holds at most `concurrency` request bodies at
    // once, however many connections it opens (one waiting in the queue holds none; a refused
    // one is read and dropped, never kept). The body timeout runs from the admission.
    let Some(permit) = host.admission(&tenant).admit().await else {
        return extract::refuse(body, MAX_INVOKE_BODY, timeout, ApiError::busy(&tenant))
            .await
            .map_err(refused);
    };
    let body = extract::body(body, declared, MAX_INVOKE_BODY, timeout)
        .await
        .map_err(refused)?;
    let req =
        InvokeRequest::parse(&body).map_err(|e| refused(ApiError::new(ErrorCode::BadJson, e)))?;
    drop(body);
    // A reload may have come while the call waited for its slot or its body: it runs under
    // the policy and the function of now (grants taken away are gone; a replaced function is
    // the new one), or not at all.
    let tenant = extract::still(&host, &tenant).map_err(refused)?;
    let Some(f) = host.function(&tenant.name, &function) else {
        return Err(refused(ApiError::new(
            ErrorCode::FunctionNotFound,
            format!(
                "tenant `{}` has no function `{function}` (it went while the call waited)",
                tenant.name
            ),
        )));
    };
    let usage = Arc::new(Usage::default());
    let mut abandoned = Abandoned {
        host: &host,
        tenant: &tenant.name,
        function: &function,
        started,
        usage: &usage,
        armed: true,
    };
    // Shared with the invocation's device calls: a batch that outlives the invocation holds
    // the slot until it ends.
    let permit = Arc::new(permit);
    let finished = host
        .invoke_using(
            &tenant,
            &f,
            req,
            Arc::clone(&usage),
            Some(Arc::clone(&permit)),
        )
        .await;
    abandoned.armed = false;
    let t = finished.timings;
    let output_bytes = finished.result.as_ref().map_or(0, |o| o.len());
    let result = finished.result.map_err(ApiError::from);
    let code = result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok");
    host.metrics.observe(
        Observation {
            tenant: &tenant.name,
            function: &function,
            code,
            total: started.elapsed(),
            compute: t.compute,
            read_bytes: finished.read,
            output_bytes,
        },
        || host.function(&tenant.name, &function).is_some(),
    );
    // An error's body is a few KiB: its slot is given back at once (unless a device batch of
    // the stopped invocation still runs, which holds it until its end).
    let out = result?;
    let encode = Instant::now();
    let len = out.len();
    let body = sending(out.header, out.data, permit, &host.outputs);
    let mut timing = ServerTiming::default();
    timing.set(Stage::Instantiate, t.instantiate);
    timing.set(Stage::Read, t.read);
    timing.set(Stage::Decode, t.guest());
    timing.set(Stage::Queue, t.queue);
    timing.set(Stage::Compute, t.compute);
    timing.set(Stage::Encode, encode.elapsed());
    timing.set(Stage::Total, started.elapsed());
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.safetensors"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(&timing.header()) {
        headers.insert("server-timing", v);
    }
    Ok((headers, body).into_response())
}

/// A response's bytes on their way to the client, each chunk holding the tenant's slot until
/// hyper lets go of it: once its last byte is written to the socket, or the connection is gone.
/// The output is host memory held for the tenant, so a client that reads none of its responses
/// keeps at most `concurrency` of them, and its next calls wait in its queue, not beside them.
/// The slot is the chunks', not the body's: hyper ends a body (and dropped it, with the slot)
/// once less than its write buffer (`MAX_HEAD`) of it was left to write, while the chunk being
/// written still held the whole output, so a client reading all but the last bytes of each
/// response kept every output on no slot.
///
/// A large output is freed on `reaper` rather than on the HTTP runtime's thread that lets go of
/// it: unmapping hundreds of MiB held that thread, and every tenant's requests on it, for tens
/// of ms. Its slot is given back there and then, not behind other tenants' outputs in the
/// reaper's queue; the reaper holds at most a bound of outputs being freed, and frees past it
/// where they are let go.
fn sending<S, D>(header: Vec<u8>, data: D, slot: Arc<S>, reaper: &Reaper) -> Body
where
    S: Send + Sync + 'static,
    D: AsRef<[u8]> + Send + 'static,
{
    let header = Held::bytes(header, Arc::clone(&slot));
    let data = Bytes::from_owner(Reaped {
        held: Some((data, slot)),
        reaper: reaper.clone(),
    });
    Body::from_stream(Sending {
        chunks: vec![header, data].into_iter(),
    })
}

/// An output's bytes and the slot they hold: the bytes handed to a reaper when let go, then
/// the slot given back.
struct Reaped<D: AsRef<[u8]> + Send + 'static, S> {
    held: Option<(D, Arc<S>)>,
    reaper: Reaper,
}

impl<D: AsRef<[u8]> + Send + 'static, S> AsRef<[u8]> for Reaped<D, S> {
    fn as_ref(&self) -> &[u8] {
        self.held.as_ref().map_or(&[], |(bytes, _)| bytes.as_ref())
    }
}

impl<D: AsRef<[u8]> + Send + 'static, S> Drop for Reaped<D, S> {
    fn drop(&mut self) {
        if let Some((bytes, slot)) = self.held.take() {
            self.reaper.free_sized(bytes.as_ref().len(), bytes);
            drop(slot);
        }
    }
}

struct Sending {
    chunks: std::vec::IntoIter<Bytes>,
}

impl Stream for Sending {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.get_mut().chunks.next().map(Ok))
    }
}

/// Charges an invocation whose client went away before it ended: hyper drops the request's
/// future when the connection closes, which stops the invocation where it is (its slot is free
/// at once, or when a device batch it was part of ends); what it used until then is still
/// counted, under code `client_closed`.
struct Abandoned<'a> {
    host: &'a Host,
    tenant: &'a str,
    function: &'a str,
    started: Instant,
    usage: &'a Usage,
    armed: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let total = self.started.elapsed();
        // At debug level: a client may hang up on thousands of calls a second, and a line each
        // at the default level would crowd out the log (journald's rate limit then drops
        // other tenants' lines); `hapi_invocations_total{code="client_closed"}` counts them.
        tracing::debug!(
            "tenant `{}`: the client closed the connection {:.3} s into `{}`; stopped it",
            self.tenant,
            total.as_secs_f64(),
            self.function
        );
        self.host.metrics.observe(
            Observation {
                tenant: self.tenant,
                function: self.function,
                code: CLIENT_CLOSED,
                total,
                compute: self.usage.compute(),
                read_bytes: self.usage.read_bytes(),
                output_bytes: 0,
            },
            || self.host.function(self.tenant, self.function).is_some(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// An output's bytes, which say on which thread they were freed.
    struct Output(Vec<u8>, Arc<std::sync::Mutex<Option<String>>>);

    impl AsRef<[u8]> for Output {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Output {
        fn drop(&mut self) {
            let here = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string();
            *self.1.lock().expect("record") = Some(here);
        }
    }

    /// Waits (up to 5 s) for the output to be freed; the thread that freed it.
    async fn freed(on: &std::sync::Mutex<Option<String>>) -> Option<String> {
        for _ in 0..500 {
            if let Some(thread) = on.lock().expect("record").clone() {
                return Some(thread);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        None
    }

    #[tokio::test]
    async fn the_slot_goes_with_the_last_of_the_outputs_bytes() {
        let reaper = Reaper::start("test-output-reaper");
        let here = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        for (size, freed_on) in [(1 << 20, "test-output-reaper"), (1000, here.as_str())] {
            let slot = Arc::new(());
            let on = Arc::new(std::sync::Mutex::new(None));
            let data = Output(vec![2; size], Arc::clone(&on));
            let mut body = sending(vec![1; 8], data, Arc::clone(&slot), &reaper);
            let mut chunks = Vec::new();
            while let Some(frame) = body.frame().await {
                chunks.push(frame.expect("frame").into_data().expect("data"));
            }
            // The body has ended and is gone (hyper drops it once the rest is queued to write);
            // the output's bytes are still held, and so is the slot.
            drop(body);
            assert_eq!(chunks.len(), 2);
            assert!(Arc::strong_count(&slot) > 1, "the slot went with the body");
            let data = chunks.pop().expect("data");
            let written = data.slice(0..100); // a part hyper has yet to write
            drop((chunks, data));
            assert!(
                Arc::strong_count(&slot) > 1,
                "a part of the output still holds it"
            );
            drop(written);
            assert_eq!(Arc::strong_count(&slot), 1, "given back with the last byte");
            // A large output is freed on the reaper, off the thread that served the response;
            // a small one where it was let go.
            let thread = freed(&on).await;
            assert_eq!(thread.as_deref(), Some(freed_on), "{size} bytes");
        }
    }
}
