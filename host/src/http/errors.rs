//! Errors as responses: one `From` per domain error, JSON `{code, message[, key]}` bodies with
//! the status the wire contract gives each code, `Retry-After` on backpressure, and no internals
//! in server errors (the log has them, under the request id).

use crate::account::text::bounded;
use crate::device::DeviceError;
use crate::functions::FunctionError;
use crate::wasm::compile::DeployError;
use crate::wasm::errors::InvokeError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hapi_wire::{ErrorBody, ErrorCode};

/// Seconds a client is asked to wait before retrying after 429 or 503.
pub const RETRY_AFTER_SECS: u64 = 1;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub key: Option<String>,
    /// For host faults and store failures: what happened, for the log only.
    pub internal: Option<String>,
}

/// What the log gets of a host fault or a store failure (`detail`), carried with what the
/// client gets (`code`, `message`) from the handler to the request-id layer, which logs the
/// detail under the request's id and answers the code and the message with that id.
#[derive(Debug, Clone)]
pub struct Fault {
    pub code: ErrorCode,
    pub message: String,
    pub detail: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: bounded(message.into()),
            key: None,
            internal: None,
        }
    }

    /// 429 `busy`: the tenant's slots and its queue are full.
    pub fn busy(tenant: &crate::policy::Tenant) -> Self {
        Self::new(
            ErrorCode::Busy,
            format!(
                "tenant `{}` already has {} invocations running and {} waiting",
                tenant.name, tenant.limits.concurrency, tenant.limits.queue
            ),
        )
    }

    /// Counts, as `tenant`'s refusal at `endpoint`, each error it is given (one answered before
    /// the request ran), and gives it back.
    pub fn counted<'a>(
        metrics: &'a crate::metrics::Metrics,
        tenant: &'a str,
        endpoint: &'static str,
    ) -> impl Fn(ApiError) -> ApiError + Copy + 'a {
        move |e| {
            metrics.refused(tenant, endpoint, e.code.as_str());
            e
        }
    }

    /// The host's own fault: the client learns only that it happened.
    pub fn fault(internal: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::HostFault,
            message: "the host failed while serving this request".into(),
            key: None,
            internal: Some(internal.into()),
        }
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let fault = self.internal.map(|detail| Fault {
            code: self.code,
            message: self.message.clone(),
            detail,
        });
        let body = serde_json::to_vec(&ErrorBody {
            code: self.code,
            message: self.message,
            key: self.key,
            request_id: None,
        })
        .unwrap_or_default();
        let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if matches!(status.as_u16(), 429 | 503) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(fault) = fault {
            resp.extensions_mut().insert(fault);
        }
        resp
    }
}

impl From<InvokeError> for ApiError {
    fn from(e: InvokeError) -> Self {
        let code = e.code();
        match e {
            InvokeError::HostFault(detail) | InvokeError::Device(DeviceError::Failed(detail)) => {
                ApiError::fault(detail)
            }
            InvokeError::Store(detail) => ApiError {
                internal: Some(detail),
                ..ApiError::new(code, "the object store failed; retry later")
            },
            e => {
                let key = e.key().map(str::to_string);
                ApiError {
                    key,
                    ..ApiError::new(code, e.to_string())
                }
            }
        }
    }
}

impl From<DeviceError> for ApiError {
    fn from(e: DeviceError) -> Self {
        InvokeError::Device(e).into()
    }
}

impl From<FunctionError> for ApiError {
    fn from(e: FunctionError) -> Self {
        match e {
            FunctionError::Host(detail) => ApiError::fault(detail),
            e => ApiError::new(e.code(), e.to_string()),
        }
    }
}

impl From<DeployError> for ApiError {
    fn from(e: DeployError) -> Self {
        ApiError::new(ErrorCode::BadComponent, e.to_string())
    }
}
