//! What handlers take from a request: the tenant (or the operator) behind its bearer token, a
//! checked name from the path, and a body read within a byte limit and a time limit.

use crate::Host;
use crate::account::text::quote;
use crate::http::errors::ApiError;
use crate::locks::lock;
use crate::policy::{Tenant, token_digest, valid_name};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path};
use axum::http::{header, request::Parts};
use hapi_wire::ErrorCode;
use std::sync::Arc;
use std::time::Duration;

/// The token of `Authorization: Bearer <token>`; the scheme is matched case-insensitively.
fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let header = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unauthenticated,
            "missing `Authorization: Bearer <token>`",
        )
    })?;
    let value = header.to_str().unwrap_or_default().trim();
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "the Authorization header is not `Bearer <token>`",
        ));
    }
    Ok(token.trim())
}

/// The tenant a request's bearer token belongs to.
#[derive(Debug)]
pub struct Authed(pub Arc<Tenant>);

impl FromRequestParts<Arc<Host>> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, host: &Arc<Host>) -> Result<Self, ApiError> {
        let found = bearer(parts).and_then(|token| {
            host.policy()
                .tenant_by_token_hash(&token_digest(token))
                .map(|t| Authed(Arc::clone(t)))
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::BadToken,
                        "the token does not belong to any tenant",
                    )
                })
        });
        // No tenant to charge: counted apart, so that guessing and missing tokens show.
        let found = found.inspect_err(|e| host.metrics.unauthenticated(e.code.as_str()))?;
        let (name, limits) = (&found.0.name, &found.0.limits);
        let cap = crate::http::conns::busy_cap(limits.concurrency, limits.queue);
        if let Err(crate::http::conns::NotBusy::OverCap(held)) = busy(parts, Some((name, cap))) {
            host.metrics
                .refused(name, "connections", ErrorCode::Busy.as_str());
            return Err(ApiError::new(
                ErrorCode::Busy,
                format!(
                    "tenant `{name}` has {held} connections busy with its requests, its cap \
                     (concurrency + queue + {}); retry once one is answered",
                    crate::http::conns::BUSY_BESIDE_INVOCATIONS
                ),
            ));
        }
        Ok(found)
    }
}

/// An authenticated request (a tenant's, with its cap of busy connections; or the
/// operator's): its connection is not closed for a newcomer until its response is sent
/// (`http/conns.rs`).
fn busy(parts: &Parts, tenant: Option<(&str, usize)>) -> Result<(), crate::http::conns::NotBusy> {
    match parts.extensions.get::<crate::http::conns::Carried>() {
        Some(c) => c.authenticated(tenant),
        None => Ok(()),
    }
}

/// The request's tenant as the policy has it now, for a handler that waited (for a slot, a
/// body): a reload meanwhile may have removed it or changed its token (401), or changed what
/// it is granted (the tenant returned has the new grants).
pub fn still(host: &Host, tenant: &Tenant) -> Result<Arc<Tenant>, ApiError> {
    host.current_tenant(tenant).ok_or_else(|| {
        ApiError::new(
            ErrorCode::BadToken,
            "the token was revoked by a policy reload while the request waited",
        )
    })
}

/// The operator, by the policy's `operator_token_sha256`.
#[derive(Debug)]
pub struct Operator;

impl FromRequestParts<Arc<Host>> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, host: &Arc<Host>) -> Result<Self, ApiError> {
        let operator = Self::check(parts, host)
            .inspect_err(|e| host.metrics.unauthenticated(e.code.as_str()))?;
        // The operator's requests have no cap; one on a connection being closed goes with it.
        let _ = busy(parts, None);
        Ok(operator)
    }
}

impl Operator {
    fn check(parts: &Parts, host: &Host) -> Result<Self, ApiError> {
        let policy = host.policy();
        if policy.host.operator_token_sha256.is_none() {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "this endpoint is the operator's: set host.operator_token_sha256 (or serve it on host.metrics_listen)",
            ));
        }
        if policy.is_operator(&token_digest(bearer(parts)?)) {
            Ok(Operator)
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                "this endpoint needs the operator's token",
            ))
        }
    }
}

/// A tenant, function or model name from the path, checked (letters, digits, `-`, `_`).
#[derive(Debug)]
pub struct Name(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Name {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::new(ErrorCode::BadName, format!("the path: {e}")))?;
        if !valid_name(&name) {
            return Err(ApiError::new(
                ErrorCode::BadName,
                format!(
                    "name `{}`: use letters, digits, `-` and `_` (at most 64)",
                    quote(&name)
                ),
            ));
        }
        Ok(Name(name))
    }
}

/// Answers `refusal` to a request whose body the host will not use, after reading and dropping
/// that body (at most `limit` bytes, within `timeout`; none of it kept), so that a client still
/// sending it gets the answer rather than a broken connection. A body past `limit` is answered
/// 413, as it would have been had it been read.
pub async fn refuse<T>(
    body: Body,
    limit: usize,
    timeout: Duration,
    refusal: ApiError,
) -> Result<T, ApiError> {
    // Refused: the connection is not held busy while the body is drained.
    let _ = CARRIED.try_with(crate::http::conns::Carried::release);
    match drain(body, limit, timeout).await {
        Drained::OverLimit => Err(ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("the request body is over this endpoint's limit of {limit} bytes"),
        )),
        Drained::All | Drained::TimedOut => Err(refusal),
    }
}

/// How reading and dropping a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    All,
    OverLimit,
    TimedOut,
}

/// Reads and drops `body`: at most `limit` bytes, within `timeout`; none of it kept.
async fn drain(mut body: Body, limit: usize, timeout: Duration) -> Drained {
    use http_body_util::BodyExt;
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > limit {
                return Drained::OverLimit;
            }
        }
        Drained::All
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Drained::TimedOut)
}

/// Reads a request body of at most `limit` bytes within `timeout`, into one buffer: each frame
/// is copied and dropped as it comes. (Collected whole, every frame stayed a `Bytes` of its
/// own, holding the connection's read buffer it was cut from: a body of 1-byte chunks held
/// tens of times its size until it was complete.) The buffer is the `declared` length (what
/// [`declared_within`] gave) where there is one, else grows as the body arrives.
pub async fn body(
    mut body: Body,
    declared: Option<u64>,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let declared = declared.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let read = async move {
        let mut out = Vec::with_capacity(declared.min(limit));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::new(
                    ErrorCode::BadRequest,
                    format!("reading the request body: {e}"),
                )
            })?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            if data.len() > limit - out.len() {
                return Err(ApiError::new(
                    ErrorCode::BodyTooLarge,
                    format!("the request body is over this endpoint's limit of {limit} bytes"),
                ));
            }
            out.extend_from_slice(data);
        }
        // Grown by doubling (no declared length), it would keep up to twice its bytes while
        // held (an upload waiting for the compiler).
        out.shrink_to_fit();
        Ok(Bytes::from(out))
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                ErrorCode::RequestTimeout,
                format!("the request body did not arrive within {timeout:?}"),
            ))
        })
}

/// Refuses a body whose declared length is already over `limit`, before reading any of it;
/// gives the declared length (`None` without one).
pub fn declared_within(
    headers: &axum::http::HeaderMap,
    limit: usize,
) -> Result<Option<u64>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("the request body is {n} bytes; this endpoint takes at most {limit}"),
        )),
        other => Ok(other),
    }
}

tokio::task_local! {
    /// The connection of the request the task serves ([`unread_bodies`] sets it), for the
    /// drains of refused bodies to release.
    static CARRIED: crate::http::conns::Carried;
}

/// What is left of a request body, shared between its handler and [`unread_bodies`].
#[derive(Default)]
struct Unread {
    body: Option<Body>,
    /// The handler read some of it (and so decided on its own limit and time).
    polled: bool,
}

/// Middleware: a body its handler did not touch (a request refused by an extractor: a bad
/// token, a bad name, no route) is read and dropped before the answer goes out, within the
/// host's `max_request` and `body_timeout`, so that a client still sending it gets the answer
/// rather than a broken connection. A body left half read (the handler stopped at its limit or
/// time), or one that cannot be drained, closes the connection after the answer
/// (`Connection: close`), so that no client sends its next request on a connection the server
/// is about to drop.
pub async fn unread_bodies(
    axum::extract::State(host): axum::extract::State<Arc<Host>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::body::HttpBody;
    let (parts, body) = req.into_parts();
    let declared = declared_within(&parts.headers, usize::MAX).ok().flatten();
    let shared = Arc::new(std::sync::Mutex::new(Unread {
        body: Some(body),
        polled: false,
    }));
    let reader = Arc::clone(&shared);
    let frames = futures::stream::poll_fn(move |cx| {
        let mut u = lock(&reader);
        u.polled = true;
        let Some(body) = u.body.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let frame = std::pin::Pin::new(body).poll_frame(cx);
        if matches!(frame, std::task::Poll::Ready(None)) {
            u.body = None;
        }
        frame
    });
    let carried = parts
        .extensions
        .get::<crate::http::conns::Carried>()
        .cloned();
    let req = axum::extract::Request::from_parts(
        parts,
        Body::new(http_body_util::StreamBody::new(frames)),
    );
    let mut resp = match &carried {
        Some(c) => CARRIED.scope(c.clone(), next.run(req)).await,
        None => next.run(req).await,
    };
    let (left, polled) = {
        let mut u = lock(&shared);
        (u.body.take(), u.polled)
    };
    let Some(body) = left.filter(|b| !b.is_end_stream()) else {
        return resp;
    };
    let http = host.policy().host.http.clone();
    if let Some(c) = &carried {
        c.release();
    }
    let drained = !polled
        && declared.is_none_or(|n| n <= http.max_request as u64)
        && drain(body, http.max_request, http.body_timeout).await == Drained::All;
    if !drained {
        resp.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
}
