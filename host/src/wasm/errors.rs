//! Every way an invocation can fail, and the one place where traps, the guest's own errors and
//! what the host saw during the call are classified into the wire contract's error codes.
//!
//! The host answers for what it saw: a device refusal or fault stops the guest (a typed trap,
//! [`Stop::Device`]) and is the answer; a store failure decides the answer when the guest failed
//! after it; a guest that reports a store failure the host never saw gets `function_error`
//! (422), not a server error.

use crate::account::text::{bounded, bounded_display, quote};
use crate::bindings::GuestError;
use crate::bindings::hapi::pushdown::objects::ObjectError as WitObjectError;
use crate::caps::caller::Stop;
use crate::caps::objects::Failure;
use crate::device::DeviceError;
use hapi_wire::ErrorCode;
use std::time::Duration;

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The guest's own typed error.
    #[error("{message}")]
    Guest {
        code: ErrorCode,
        message: String,
        key: Option<String>,
    },
    /// A limit stopped the guest inside a host call (memory, handles, time).
    #[error("{0}")]
    Stopped(Stop),
    /// The deadline passed while guest code ran.
    #[error("time limit of {0:?} exceeded")]
    TimeLimit(Duration),
    #[error("the response would be {size} bytes, over the output limit of {limit}")]
    OutputTooLarge { size: u64, limit: u64 },
    #[error("output tensor is malformed: {0}")]
    BadOutput(String),
    #[error("the function trapped: {0}")]
    Trapped(String),
    /// The device refused the function's compute call, or failed.
    #[error("{0}")]
    Device(DeviceError),
    /// The object store failed.
    #[error("the object store failed: {0}")]
    Store(String),
    /// The host has no instance slot free (all tenants' invocations together): backpressure.
    #[error("the host runs as many invocations as it can ({0}); retry shortly")]
    Capacity(String),
    /// The host's own fault (details for the log).
    #[error("{0}")]
    HostFault(String),
}

impl InvokeError {
    /// The error code the client sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            InvokeError::Guest { code, .. } => *code,
            InvokeError::Stopped(Stop::Device(d)) | InvokeError::Device(d) => device_code(d),
            InvokeError::Stopped(Stop::Memory(_)) => ErrorCode::MemoryLimitExceeded,
            InvokeError::Stopped(Stop::Table(_)) => ErrorCode::TableLimitExceeded,
            InvokeError::Stopped(Stop::Revoked(_)) => ErrorCode::BadToken,
            InvokeError::Stopped(Stop::Time { .. }) | InvokeError::TimeLimit(_) => {
                ErrorCode::TimeLimitExceeded
            }
            InvokeError::OutputTooLarge { .. } => ErrorCode::OutputTooLarge,
            InvokeError::BadOutput(_) => ErrorCode::BadOutput,
            InvokeError::Trapped(_) => ErrorCode::FunctionTrapped,
            InvokeError::Store(_) => ErrorCode::StoreUnavailable,
            InvokeError::Capacity(_) => ErrorCode::Busy,
            InvokeError::HostFault(_) => ErrorCode::HostFault,
        }
    }

    /// The object key the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            InvokeError::Guest { key, .. } => key.as_deref(),
            _ => None,
        }
    }
}

/// The code of a device's refusal or fault.
fn device_code(d: &DeviceError) -> ErrorCode {
    match d {
        DeviceError::Busy(_) => ErrorCode::DeviceBusy,
        DeviceError::TooLarge(_) => ErrorCode::DoesNotFitDevice,
        DeviceError::ShuttingDown => ErrorCode::ShuttingDown,
        DeviceError::Expired(_) | DeviceError::Stopped(_) => ErrorCode::TimeLimitExceeded,
        DeviceError::Memory(_) => ErrorCode::MemoryLimitExceeded,
        DeviceError::Failed(_) => ErrorCode::HostFault,
    }
}

/// A trap or host-call error that ended the guest.
pub fn classify_trap(e: wasmtime::Error, limit: Duration) -> InvokeError {
    if let Some(stop) = e.downcast_ref::<Stop>() {
        return match stop {
            Stop::Device(d) => InvokeError::Device(d.clone()),
            other => InvokeError::Stopped(other.clone()),
        };
    }
    if let Some(full) = e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
        return InvokeError::Capacity(full.to_string());
    }
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return InvokeError::TimeLimit(limit);
    }
    if let Some(wasmtime::component::ResourceTableError::Full) =
        e.downcast_ref::<wasmtime::component::ResourceTableError>()
    {
        return InvokeError::Stopped(Stop::Table(format!(
            "more than {} handles held at once",
            crate::wasm::limits::MAX_HANDLES
        )));
    }
    // A trap in guest code, or a misuse of a host interface (a stale handle): the guest's
    // doing as far as the caller is concerned; the host itself is unaffected.
    InvokeError::Trapped(bounded_display(&e))
}

/// What the host saw of the store during the invocation, which decides the answer when the
/// guest failed.
#[derive(Debug, Default)]
pub struct Witness {
    pub store_fault: Option<String>,
    pub last_object_failure: Option<(Failure, String)>,
}

/// The guest's typed error, judged against what the host saw.
pub fn guest_error(e: GuestError, seen: Witness) -> InvokeError {
    let key_of = |kind: Failure| {
        seen.last_object_failure
            .as_ref()
            .filter(|(k, _)| *k == kind)
            .map(|(_, key)| key.clone())
    };
    let guest = |code, message: String, key| InvokeError::Guest {
        code,
        message: bounded(message),
        key,
    };
    match e {
        GuestError::BadRequest(m) => {
            guest(ErrorCode::BadRequest, format!("bad request: {m}"), None)
        }
        GuestError::BadObject(f) => guest(
            ErrorCode::BadObject,
            format!("bad object `{}`: {}", quote(&f.key), f.reason),
            Some(quote(&f.key)),
        ),
        GuestError::Inference(m) => guest(
            ErrorCode::InferenceFailed,
            format!("inference failed: {m}"),
            None,
        ),
        GuestError::Object(WitObjectError::NotFound(m)) => guest(
            ErrorCode::ObjectNotFound,
            format!("object not found: {m}"),
            key_of(Failure::NotFound),
        ),
        GuestError::Object(WitObjectError::Denied(m)) => guest(
            ErrorCode::ObjectDenied,
            format!("access denied: {m}"),
            key_of(Failure::Denied),
        ),
        // `too-large` carries a byte cap, or a listing's bound on entries visited: the host
        // saw which.
        GuestError::Object(WitObjectError::TooLarge(n)) => match key_of(Failure::TooManyEntries) {
            Some(prefix) => guest(
                ErrorCode::ObjectTooLarge,
                format!(
                    "a listing visits at most {n} entries and `{prefix}` holds more within \
                     the tenant's grants; list a longer prefix"
                ),
                Some(prefix),
            ),
            None => guest(
                ErrorCode::ObjectTooLarge,
                format!("read over the byte cap of {n}"),
                key_of(Failure::TooLarge),
            ),
        },
        GuestError::Object(WitObjectError::Io(m)) => match seen.store_fault {
            Some(fault) => InvokeError::Store(fault),
            None => guest(
                ErrorCode::FunctionError,
                format!("the function reported a store error the host did not see: {m}"),
                None,
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(e: InvokeError) -> String {
        match e {
            InvokeError::Guest { message, .. } => message,
            other => panic!("not the guest's error: {other:?}"),
        }
    }

    #[test]
    fn too_large_says_whether_a_byte_cap_or_a_listings_bound_was_passed() {
        let seen = |kind| Witness {
            store_fault: None,
            last_object_failure: Some((kind, "train/".to_string())),
        };
        let too_large = || GuestError::Object(WitObjectError::TooLarge(200_000));
        let listing = message(guest_error(too_large(), seen(Failure::TooManyEntries)));
        assert!(
            listing.starts_with("a listing visits at most 200000 entries and `train/` holds more"),
            "{listing}"
        );
        let read = message(guest_error(too_large(), seen(Failure::TooLarge)));
        assert_eq!(read, "read over the byte cap of 200000");
    }
}
