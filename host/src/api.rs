//! The HTTP API (axum).
//!
//! Errors are JSON `{"code": ..., "message": ...}` with stable codes: 4xx when the client or
//! its function is at fault, 429 with `Retry-After` for backpressure, 5xx only for the host's
//! own faults.

use crate::metrics::Observation;
use crate::policy::{Tenant, token_digest};
use crate::runtime::{ElementType, GuestErrorMessage, Invocation, InvokeError, MAX_KEYS, Trap};
use crate::{Host, runtime};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&ErrorBody {
            code: self.code,
            message: &self.message,
        })
        .unwrap_or_default();
        let mut resp = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The tenant a request's bearer token belongs to.
#[derive(Debug)]
pub struct Authed(pub Arc<Tenant>);

impl FromRequestParts<Arc<Host>> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, host: &Arc<Host>) -> Result<Self, ApiError> {
        let header = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "missing `Authorization: Bearer <token>`",
            )
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "the Authorization header is not `Bearer <token>`",
                )
            })?;
        let policy = host.policy();
        policy
            .tenant_by_token_hash(&token_digest(token.trim()))
            .map(|t| Authed(Arc::clone(t)))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "bad_token",
                    "the token does not belong to any tenant",
                )
            })
    }
}

/// The router over `host`.
pub fn router(host: Arc<Host>) -> Router {
    let max_request = host.policy().host.max_request;
    Router::new()
        .route("/v1/invoke/{function}", post(invoke))
        .route("/v1/functions", get(list_functions))
        .route("/v1/functions/{name}", put(deploy).delete(undeploy))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{name}/profile", get(profile))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such endpoint") })
        .layer(DefaultBodyLimit::max(max_request))
        .with_state(host)
}

/// The JSON body of `POST /v1/invoke/{function}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    pub bucket: String,
    pub keys: Vec<String>,
    pub model: String,
    pub split: u32,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

fn guest_error_status(e: &runtime::GuestError) -> (StatusCode, &'static str) {
    use crate::runtime::bindings::hapi::pushdown::objects::ObjectError as O;
    match e {
        runtime::GuestError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        runtime::GuestError::BadObject(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad_object"),
        runtime::GuestError::Inference(_) => (StatusCode::UNPROCESSABLE_ENTITY, "inference_failed"),
        runtime::GuestError::Object(O::NotFound(_)) => (StatusCode::NOT_FOUND, "object_not_found"),
        runtime::GuestError::Object(O::Denied(_)) => (StatusCode::FORBIDDEN, "object_denied"),
        runtime::GuestError::Object(O::TooLarge(_)) => {
            (StatusCode::PAYLOAD_TOO_LARGE, "object_too_large")
        }
        runtime::GuestError::Object(O::Io(_)) => (StatusCode::INTERNAL_SERVER_ERROR, "store_error"),
    }
}

fn invoke_error(e: InvokeError) -> ApiError {
    let (status, code) = match &e {
        InvokeError::Guest(GuestErrorMessage(g)) => guest_error_status(g),
        InvokeError::TimeLimit(_) => (StatusCode::UNPROCESSABLE_ENTITY, "time_limit_exceeded"),
        InvokeError::Limit(Trap::MemoryLimit { .. } | Trap::TensorMemory { .. }) => {
            (StatusCode::UNPROCESSABLE_ENTITY, "memory_limit_exceeded")
        }
        InvokeError::Limit(Trap::TableLimit) => {
            (StatusCode::UNPROCESSABLE_ENTITY, "table_limit_exceeded")
        }
        InvokeError::OutputTooLarge { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, "output_too_large")
        }
        InvokeError::BadOutput(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad_output"),
        InvokeError::GuestTrap(_) => (StatusCode::UNPROCESSABLE_ENTITY, "function_trapped"),
        InvokeError::Host(_) => (StatusCode::INTERNAL_SERVER_ERROR, "host_error"),
    };
    ApiError::new(status, code, e.to_string())
}

/// The host's answer when the device refused a compute call.
fn device_error(e: crate::device::DeviceError) -> ApiError {
    use crate::device::DeviceError as D;
    match e {
        D::Busy { .. } => ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "device_busy",
                e.to_string(),
            )
        },
        D::TooLarge(_) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_fit_device",
            e.to_string(),
        ),
        D::Failed(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "host_error",
            e.to_string(),
        ),
    }
}

/// Runs blocking work (Wasm, libtorch, compilation) off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "host_error",
            format!("worker: {e}"),
        )
    })
}

fn require_deploy(tenant: &Tenant) -> ApiResult<()> {
    if tenant.deploy {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "deploy_not_allowed",
            format!("tenant `{}` may not deploy functions", tenant.name),
        ))
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_json",
            format!("request body: {e}"),
        )
    })
}

async fn invoke(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Path(function): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let started = Instant::now();
    let req: InvokeRequest = parse_json(&body)?;
    if req.keys.len() > MAX_KEYS {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "too_many_keys",
            format!("{} keys; at most {MAX_KEYS} per invocation", req.keys.len()),
        ));
    }
    let f = host.function(&tenant.name, &function).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "function_not_found",
            format!("tenant `{}` has no function `{function}`", tenant.name),
        )
    })?;
    let admission = host.permits(&tenant);
    let permit = admission.admit().await.ok_or_else(|| ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            format!(
                "tenant `{}` already has {} invocations running and {} waiting",
                tenant.name, tenant.limits.concurrency, tenant.limits.queue
            ),
        )
    })?;
    let invocation = Invocation {
        bucket: req.bucket,
        keys: req.keys,
        model: req.model.clone(),
        split: req.split,
        options: req.options.into_iter().collect(),
    };
    let worker_host = Arc::clone(&host);
    let worker_tenant = Arc::clone(&tenant);
    let runtime::Finished {
        result,
        timings,
        read,
        refused,
    } = blocking(move || {
        let _permit = permit;
        worker_host
            .runtime()
            .invoke(&worker_tenant, &f, &invocation)
    })
    .await?;
    let result = match refused {
        Some(e) => Err(device_error(e)),
        None => result.map_err(invoke_error),
    };

    let encode_started = Instant::now();
    let outcome = result.and_then(|out| {
        encode_safetensors(
            &out,
            &[
                ("function", function.clone()),
                ("tenant", tenant.name.clone()),
                ("model", req.model.clone()),
                ("split", req.split.to_string()),
            ],
        )
    });
    let encode = encode_started.elapsed();
    let code = outcome.as_ref().map_or_else(|e| e.code, |_| "ok");
    let output_bytes = outcome.as_ref().map_or(0, |b| b.len() as u64);
    host.metrics.observe(Observation {
        tenant: &tenant.name,
        function: &function,
        code,
        total: started.elapsed(),
        compute: timings.compute,
        read_bytes: read,
        output_bytes,
    });
    let body = outcome?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let timing = format!(
        "instantiate;dur={:.3}, read;dur={:.3}, decode;dur={:.3}, queue;dur={:.3}, compute;dur={:.3}, encode;dur={:.3}, total;dur={:.3}",
        ms(timings.instantiate),
        ms(timings.read),
        ms(timings.guest()),
        ms(timings.queued),
        ms(timings.compute),
        ms(encode),
        ms(started.elapsed()),
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.safetensors"),
    );
    if let Ok(v) = HeaderValue::from_str(&timing) {
        headers.insert("server-timing", v);
    }
    Ok((headers, body).into_response())
}

/// The output as a safetensors file with one tensor, `features`, and metadata naming what
/// produced it.
fn encode_safetensors(out: &runtime::TensorOut, meta: &[(&str, String)]) -> ApiResult<Vec<u8>> {
    use safetensors::tensor::{Dtype, TensorView};
    let dtype = match out.ty {
        ElementType::F32 => Dtype::F32,
        ElementType::U8 => Dtype::U8,
        ElementType::I64 => Dtype::I64,
    };
    let shape: Vec<usize> = out.dimensions.iter().map(|&d| d as usize).collect();
    let view = TensorView::new(dtype, shape, &out.data).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_output",
            format!("{e:?}"),
        )
    })?;
    let metadata: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    safetensors::tensor::serialize([("features", view)], &Some(metadata)).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "host_error",
            format!("encoding safetensors: {e:?}"),
        )
    })
}

#[derive(Serialize)]
struct FunctionInfo {
    name: String,
    sha256: String,
    size: usize,
}

async fn list_functions(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
) -> impl IntoResponse {
    let list: Vec<FunctionInfo> = host
        .functions(&tenant.name)
        .into_iter()
        .map(|f| FunctionInfo {
            name: f.name,
            sha256: f.sha256,
            size: f.size,
        })
        .collect();
    axum::Json(list)
}

fn valid_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

async fn deploy(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    require_deploy(&tenant)?;
    if !valid_function_name(&name) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_name",
            format!("function name `{name}`: use letters, digits, `-` and `_`"),
        ));
    }
    let worker = Arc::clone(&host);
    let t = Arc::clone(&tenant);
    let n = name.clone();
    let f = blocking(move || worker.deploy(&t, &n, &body))
        .await?
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_component",
                format!("function `{name}`: {e}"),
            )
        })?;
    Ok((
        StatusCode::CREATED,
        axum::Json(FunctionInfo {
            name: f.name,
            sha256: f.sha256,
            size: f.size,
        }),
    ))
}

async fn undeploy(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    require_deploy(&tenant)?;
    if host.undeploy(&tenant, &name) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "function_not_found",
            format!("tenant `{}` has no function `{name}`", tenant.name),
        ))
    }
}

#[derive(Serialize)]
struct ModelInfo<'a> {
    name: &'a str,
    display_name: &'a str,
    weights: &'a str,
    layers: usize,
    freeze_index: usize,
    input: &'a hapi_model::InputSpec,
    output_bytes_per_sample: Vec<u64>,
}

async fn list_models(State(host): State<Arc<Host>>, Authed(tenant): Authed) -> impl IntoResponse {
    let models = host.runtime().models();
    let list: Vec<ModelInfo<'_>> = models
        .manifests()
        .filter(|m| tenant.models.contains(&m.name))
        .map(|m| ModelInfo {
            name: &m.name,
            display_name: &m.display_name,
            weights: &m.weights,
            layers: m.layers.len(),
            freeze_index: m.freeze_index,
            input: &m.input,
            output_bytes_per_sample: m
                .layers
                .iter()
                .map(hapi_model::Layer::output_bytes_per_sample)
                .collect(),
        })
        .collect();
    axum::Json(serde_json::to_value(list).unwrap_or_default())
}

#[derive(Serialize)]
struct Profile {
    model: String,
    device: String,
    batch: i64,
    layers: Vec<hapi_model::profile::LayerProfile>,
    /// Per-layer memory on this device (the storage batch adaptation's model).
    memory: crate::memory::ModelMemory,
    /// The device's budget and what holds it now.
    device_memory: crate::device::DeviceSnapshot,
}

async fn profile(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    if !tenant.models.contains(&name) || host.runtime().models().manifest(&name).is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("no model `{name}` for tenant `{}`", tenant.name),
        ));
    }
    let worker = Arc::clone(&host);
    let n = name.clone();
    let (layers, memory) = blocking(move || {
        let models = worker.runtime().models();
        Ok::<_, String>((models.profile(&n)?, models.memory(&n)?))
    })
    .await?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "host_error", e))?;
    Ok(axum::Json(Profile {
        model: name,
        device: format!("{:?}", host.runtime().models().device()),
        batch: crate::models::PROFILE_BATCH,
        layers: layers.as_ref().clone(),
        memory: memory.as_ref().clone(),
        device_memory: host.device().snapshot(),
    }))
}

async fn metrics(State(host): State<Arc<Host>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        let mut text = host.metrics.render();
        host.device().render_metrics(&mut text);
        text
    })
}
