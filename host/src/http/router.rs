//! Routes, and what every response goes through: a request id (the `x-request-id` header, the
//! key of the log's lines about the request), host faults logged under it and answered without
//! their details, and a JSON error body for every error the server sends, including those of
//! axum's own extractors and routing.

use crate::Host;
use crate::account::text::bounded;
use crate::http::errors::{ApiError, Fault};
use crate::http::extract::Operator;
use crate::http::server::Connections;
use crate::http::{functions, invoke, models, placement};
use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use hapi_wire::{ErrorBody, ErrorCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The request's id.
#[derive(Debug, Clone)]
pub struct RequestId(pub Arc<str>);

fn next_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{:016x}", unlinkable(NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// `n` through a keyed permutation of the 64-bit numbers (a four-round Feistel network whose
/// round function is SipHash under a key drawn when the process starts): ids stay unique, but
/// two of them say nothing of how many requests came between them. A counter in the clear let
/// anyone, without a token, poll `/healthz` and read every neighbour's request rate off the
/// difference of two ids (and the host's start time off their prefix).
fn unlinkable(n: u64) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(std::hash::RandomState::new);
    let (mut left, mut right) = ((n >> 32) as u32, n as u32);
    for round in 0u8..4 {
        let f = key.hash_one((round, right)) as u32;
        (left, right) = (right, left ^ f);
    }
    (u64::from(left) << 32) | u64::from(right)
}

/// The code for an error status that no handler gave a code of its own.
fn code_of(status: StatusCode) -> ErrorCode {
    match status.as_u16() {
        404 => ErrorCode::NoRoute,
        405 => ErrorCode::MethodNotAllowed,
        408 => ErrorCode::RequestTimeout,
        413 => ErrorCode::BodyTooLarge,
        500..=599 => ErrorCode::HostFault,
        _ => ErrorCode::BadRequest,
    }
}

async fn request_id(mut req: Request, next: Next) -> Response {
    let id: Arc<str> = Arc::from(next_id());
    req.extensions_mut().insert(RequestId(Arc::clone(&id)));
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = next.run(req).await;
    let status = resp.status();
    let fault = resp.extensions().get::<Fault>().cloned();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let mut resp = if let Some(Fault {
        code,
        message,
        detail,
    }) = fault
    {
        let what = match code {
            ErrorCode::HostFault => "host fault",
            _ => "store failure",
        };
        tracing::error!(request_id = %id, %method, path = %bounded(path), "{what}: {}", bounded(detail));
        // The client's code and message (a store failure stays `store_unavailable`, which
        // clients and `hapi_invocations_total` name it), never the detail.
        let body = ErrorBody {
            code,
            message: format!("{message}; the operator's log has the details under request id {id}"),
            key: None,
            request_id: Some(id.to_string()),
        };
        json_response(status, &body)
    } else if (status.is_client_error() || status.is_server_error()) && !json {
        // An error from axum itself (a route's method, a body limit): as JSON like the rest.
        let (parts, body) = resp.into_parts();
        let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
        let mut message = String::from_utf8_lossy(&text).trim().to_string();
        if message.is_empty() {
            message = status.canonical_reason().unwrap_or("error").to_string();
        }
        let code = code_of(status);
        let mut r = json_response(
            status,
            &ErrorBody {
                code,
                message: bounded(message),
                key: None,
                request_id: code.retryable().then(|| id.to_string()),
            },
        );
        for h in [header::ALLOW, header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
            if let Some(v) = parts.headers.get(&h) {
                r.headers_mut().insert(h, v.clone());
            }
        }
        r
    } else {
        resp
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

fn json_response(status: StatusCode, body: &ErrorBody) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response();
    if matches!(status.as_u16(), 429 | 503) {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(crate::http::errors::RETRY_AFTER_SECS),
        );
    }
    r
}

/// The API over `host`. Bodies are read by the handlers, each with its own limit and timeout.
/// `/metrics` reports `conns`, the connections the server counts.
pub fn router(host: Arc<Host>, conns: Arc<Connections>) -> Router {
    Router::new()
        .route("/v1/invoke/{function}", post(invoke::invoke))
        .route("/v1/functions", get(functions::list))
        .route(
            "/v1/functions/{name}",
            put(functions::deploy).delete(functions::undeploy),
        )
        .route("/v1/models", get(models::list))
        .route("/v1/models/{name}/profile", get(models::profile))
        .route(
            "/v1/placement",
            get(placement::report).post(placement::lookup),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(operator_metrics))
        .fallback(|| async { ApiError::new(ErrorCode::NoRoute, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "this endpoint does not take that method",
            )
        })
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(
            Arc::clone(&host),
            crate::http::extract::unread_bodies,
        ))
        .layer(Extension(conns))
        .layer(middleware::from_fn(request_id))
        .with_state(host)
}

/// `/metrics` without a token and `/healthz`, for `host.metrics_listen` (an address only the
/// operator's monitoring reaches).
pub fn metrics_router(host: Arc<Host>, conns: Arc<Connections>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(|| async { ApiError::new(ErrorCode::NoRoute, "no such endpoint") })
        .layer(Extension(conns))
        .layer(middleware::from_fn(request_id))
        .with_state(host)
}

async fn operator_metrics(
    state: State<Arc<Host>>,
    _: Operator,
    conns: Option<Extension<Arc<Connections>>>,
) -> Response {
    metrics(state, conns).await
}

async fn metrics(
    State(host): State<Arc<Host>>,
    conns: Option<Extension<Arc<Connections>>>,
) -> Response {
    let mut text = host.metrics.render();
    host.device().render_metrics(&mut text);
    if let Some(near) = host.runtime().objects().locality() {
        near.render_metrics(&mut text);
    }
    if let Some(Extension(c)) = conns {
        text.push_str(&format!(
            "# HELP hapi_http_connections Open connections.\n# TYPE hapi_http_connections gauge\nhapi_http_connections {}\n",
            c.open()
        ));
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        Body::from(text),
    )
        .into_response()
}
