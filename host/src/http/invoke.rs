//! `POST /v1/invoke/{function}`: JSON invocation in, safetensors out, timings in
//! `Server-Timing`.

use crate::Host;
use crate::http::errors::ApiError;
use crate::http::extract::{self, Authed, Name};
use crate::metrics::Observation;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use hapi_wire::invoke::MAX_INVOKE_BODY;
use hapi_wire::{ErrorCode, InvokeRequest, ServerTiming, Stage};
use std::sync::Arc;
use std::time::Instant;

pub async fn invoke(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Name(function): Name,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    extract::declared_within(&headers, MAX_INVOKE_BODY)?;
    let timeout = host.policy().host.http.body_timeout;
    let body = extract::body(body, MAX_INVOKE_BODY, timeout).await?;
    let req = InvokeRequest::parse(&body).map_err(|e| ApiError::new(ErrorCode::BadJson, e))?;
    drop(body);
    let f = host.function(&tenant.name, &function).ok_or_else(|| {
        ApiError::new(
            ErrorCode::FunctionNotFound,
            format!("tenant `{}` has no function `{function}`", tenant.name),
        )
    })?;
    let permit = host.admission(&tenant).admit().await.ok_or_else(|| {
        ApiError::new(
            ErrorCode::Busy,
            format!(
                "tenant `{}` already has {} invocations running and {} waiting",
                tenant.name, tenant.limits.concurrency, tenant.limits.queue
            ),
        )
    })?;
    let finished = host.invoke(&tenant, &f, req).await;
    drop(permit);
    let t = finished.timings;
    let output_bytes = finished.result.as_ref().map_or(0, |o| o.len());
    let result = finished.result.map_err(ApiError::from);
    let code = result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok");
    host.metrics.observe(Observation {
        tenant: &tenant.name,
        function: &function,
        code,
        total: started.elapsed(),
        compute: t.compute,
        read_bytes: finished.read,
        output_bytes,
    });
    let out = result?;
    let encode = Instant::now();
    let len = out.len();
    let body = Body::from_stream(futures::stream::iter([
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(out.header)),
        Ok(axum::body::Bytes::from(out.data)),
    ]));
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
