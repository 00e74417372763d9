//! Errors as the host sends them: JSON `{"code", "message"}` with a stable code.
//!
//! The code decides what a client does; the message is for people. 4xx codes are the caller's
//! (or its function's) fault and retrying the same request will not help; 429 and 503 are
//! backpressure, to be retried after `Retry-After`; 500 is the host's own fault and carries a
//! request id that the host's log has the details for.

use serde::{Deserialize, Serialize};

/// Every code the host sends. Clients must treat a code they do not know by its HTTP status
/// (it deserialises as [`ErrorCode::Unknown`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    // 400: the request itself is malformed.
    /// The body is not the JSON the endpoint takes.
    BadJson,
    /// The invocation is invalid (the function said so, or a field is out of bounds).
    BadRequest,
    /// A function, tenant or model name in the path is not a valid name.
    BadName,
    // 401
    /// No `Authorization: Bearer <token>` header.
    Unauthenticated,
    /// The token belongs to no tenant.
    BadToken,
    // 403
    /// The tenant may not deploy functions.
    DeployNotAllowed,
    /// An object outside the tenant's grants, or a key that is not a valid relative key.
    ObjectDenied,
    /// The tenant's function quota (count or bytes) is used up.
    QuotaExceeded,
    /// The endpoint needs the operator's token.
    Forbidden,
    // 404
    FunctionNotFound,
    ModelNotFound,
    ObjectNotFound,
    /// No such endpoint.
    NoRoute,
    // 405
    MethodNotAllowed,
    // 408
    /// The request's headers or body did not arrive in time.
    RequestTimeout,
    // 409
    /// The function was deployed by the operator's policy: the API cannot replace or remove it.
    FunctionManagedByPolicy,
    // 413
    /// The request body is over the endpoint's limit.
    BodyTooLarge,
    /// An object, or the invocation's reads together, are over a byte cap.
    ObjectTooLarge,
    // 422: the function (or the component) misbehaved; the host is unaffected.
    /// The uploaded bytes are not a component this tenant may deploy.
    BadComponent,
    /// The invocation ran past its time limit (wherever it was: in the guest, in a host call,
    /// waiting for the device).
    TimeLimitExceeded,
    /// Guest memory and what the host holds for the invocation went over its memory limit.
    MemoryLimitExceeded,
    /// The guest's table or resource handles went over their limit.
    TableLimitExceeded,
    /// The encoded output is over the tenant's output limit.
    OutputTooLarge,
    /// The output tensor's shape and data do not agree.
    BadOutput,
    /// The guest trapped (a panic, an out-of-bounds access, a misuse of a host interface).
    FunctionTrapped,
    /// The function returned an error that the host cannot vouch for (it claims a store
    /// failure the host did not see).
    FunctionError,
    /// An object could not be decoded; `key` names it.
    BadObject,
    /// A model segment could not run on the given input.
    InferenceFailed,
    /// The segment cannot fit the device's memory budget even alone.
    DoesNotFitDevice,
    // 429: backpressure; retry after `Retry-After`.
    /// The tenant has its `concurrency` invocations running and its `queue` full.
    Busy,
    /// The host's compile queue holds the tenant's previous upload still.
    DeployBusy,
    /// The device has no room now, or the model is still loading (its first use).
    DeviceBusy,
    // 503
    /// The object store failed.
    StoreUnavailable,
    /// The host is shutting down.
    ShuttingDown,
    // 500
    /// The host's own fault; the message carries a request id for the operator's log.
    HostFault,
    /// A code this build does not know (sent by a newer host).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The HTTP status the host answers with.
    pub fn status(self) -> u16 {
        use ErrorCode as C;
        match self {
            C::BadJson | C::BadRequest | C::BadName => 400,
            C::Unauthenticated | C::BadToken => 401,
            C::DeployNotAllowed | C::ObjectDenied | C::QuotaExceeded | C::Forbidden => 403,
            C::FunctionNotFound | C::ModelNotFound | C::ObjectNotFound | C::NoRoute => 404,
            C::MethodNotAllowed => 405,
            C::RequestTimeout => 408,
            C::FunctionManagedByPolicy => 409,
            C::BodyTooLarge | C::ObjectTooLarge => 413,
            C::BadComponent
            | C::TimeLimitExceeded
            | C::MemoryLimitExceeded
            | C::TableLimitExceeded
            | C::OutputTooLarge
            | C::BadOutput
            | C::FunctionTrapped
            | C::FunctionError
            | C::BadObject
            | C::InferenceFailed
            | C::DoesNotFitDevice => 422,
            C::Busy | C::DeployBusy | C::DeviceBusy => 429,
            C::StoreUnavailable | C::ShuttingDown => 503,
            C::HostFault | C::Unknown => 500,
        }
    }

    /// Whether the same request may succeed later (backpressure or a passing fault).
    pub fn retryable(self) -> bool {
        matches!(self.status(), 429 | 500 | 503)
    }

    /// Whether the error is about one object of the request (then [`ErrorBody::key`] names it).
    pub fn is_about_an_object(self) -> bool {
        matches!(
            self,
            ErrorCode::BadObject
                | ErrorCode::ObjectNotFound
                | ErrorCode::ObjectTooLarge
                | ErrorCode::ObjectDenied
        )
    }

    /// The code as it appears in JSON (`"time_limit_exceeded"`).
    pub fn as_str(self) -> &'static str {
        use ErrorCode as C;
        match self {
            C::BadJson => "bad_json",
            C::BadRequest => "bad_request",
            C::BadName => "bad_name",
            C::Unauthenticated => "unauthenticated",
            C::BadToken => "bad_token",
            C::DeployNotAllowed => "deploy_not_allowed",
            C::ObjectDenied => "object_denied",
            C::QuotaExceeded => "quota_exceeded",
            C::Forbidden => "forbidden",
            C::FunctionNotFound => "function_not_found",
            C::ModelNotFound => "model_not_found",
            C::ObjectNotFound => "object_not_found",
            C::NoRoute => "no_route",
            C::MethodNotAllowed => "method_not_allowed",
            C::RequestTimeout => "request_timeout",
            C::FunctionManagedByPolicy => "function_managed_by_policy",
            C::BodyTooLarge => "body_too_large",
            C::ObjectTooLarge => "object_too_large",
            C::BadComponent => "bad_component",
            C::TimeLimitExceeded => "time_limit_exceeded",
            C::MemoryLimitExceeded => "memory_limit_exceeded",
            C::TableLimitExceeded => "table_limit_exceeded",
            C::OutputTooLarge => "output_too_large",
            C::BadOutput => "bad_output",
            C::FunctionTrapped => "function_trapped",
            C::FunctionError => "function_error",
            C::BadObject => "bad_object",
            C::InferenceFailed => "inference_failed",
            C::DoesNotFitDevice => "does_not_fit_device",
            C::Busy => "busy",
            C::DeployBusy => "deploy_busy",
            C::DeviceBusy => "device_busy",
            C::StoreUnavailable => "store_unavailable",
            C::ShuttingDown => "shutting_down",
            C::HostFault => "host_fault",
            C::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON body of every error response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// The object key the error is about, when it is about one of the request's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The request's id (also in the `x-request-id` header): what the host's log is keyed by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialise_as_their_names_and_unknown_ones_are_tolerated() {
        for code in [
            ErrorCode::TimeLimitExceeded,
            ErrorCode::FunctionManagedByPolicy,
            ErrorCode::HostFault,
            ErrorCode::DoesNotFitDevice,
        ] {
            let json = serde_json::to_string(&code).expect("serialise");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(
                serde_json::from_str::<ErrorCode>(&json).expect("parse"),
                code
            );
        }
        let body: ErrorBody =
            serde_json::from_str(r#"{"code": "from_the_future", "message": "m"}"#)
                .expect("unknown code");
        assert_eq!(body.code, ErrorCode::Unknown);
        assert_eq!(body.code.status(), 500);
    }

    #[test]
    fn backpressure_and_host_faults_are_retryable_client_errors_are_not() {
        assert!(ErrorCode::Busy.retryable());
        assert!(ErrorCode::DeviceBusy.retryable());
        assert!(ErrorCode::HostFault.retryable());
        assert!(!ErrorCode::TimeLimitExceeded.retryable());
        assert!(!ErrorCode::BadObject.retryable());
        assert_eq!(ErrorCode::BadObject.status(), 422);
    }
}
