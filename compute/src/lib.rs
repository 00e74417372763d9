//! HAPI's compute tier: a transfer-learning trainer that pushes the first frozen layers down
//! to the storage tier (`hapi-host`), chooses where to cut from measurements, keeps storage
//! requests for the next iterations in flight while it trains the current one, and trains a
//! new head on the features.
//!
//! The binary is `hapi-train`; [`job::Job`] is the library entry point.

/// The storage tier's HTTP API, as the public `hapi-client` crate offers it.
pub use hapi_client as client;
pub mod adapt;
pub mod dataset;
pub mod features;
pub mod head;
pub mod job;
pub mod pipeline;
pub mod plan;
pub mod source;

/// Process exit codes of `hapi-train`.
pub mod exit {
    /// A usage error (clap's code).
    pub const USAGE: u8 = 2;
    /// A storage host was not reachable when the job started.
    pub const UNREACHABLE: u8 = 3;
    /// A stored object was missing or corrupt (and `--skip-bad` was not given).
    pub const BAD_OBJECT: u8 = 4;
    /// The storage tier kept failing past the retry budget, or answered with a body that is
    /// not features.
    pub const STORAGE: u8 = 5;
    /// The storage tier refused a request outright (a wrong token, a function or model the
    /// tenant does not have, a body over a limit, a segment that never fits the device: see
    /// `is_refusal`): asking again would get the same answer, so a service manager should not
    /// restart the job.
    pub const REFUSED: u8 = 6;
    /// Anything else.
    pub const OTHER: u8 = 1;
}

/// The exit code for a failed job.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.downcast_ref::<client::Unreachable>().is_some() {
            return exit::UNREACHABLE;
        }
        if let Some(f) = cause.downcast_ref::<source::FetchError>() {
            return match f {
                source::FetchError::BadObject { .. } => exit::BAD_OBJECT,
                source::FetchError::Invoke(e) => invoke_exit_code(e),
                source::FetchError::Other(_) => exit::OTHER,
            };
        }
        if let Some(e) = cause.downcast_ref::<client::InvokeError>() {
            return invoke_exit_code(e);
        }
    }
    exit::OTHER
}

fn invoke_exit_code(e: &client::InvokeError) -> u8 {
    match e {
        client::InvokeError::BadObject { .. } => exit::BAD_OBJECT,
        client::InvokeError::Rejected { status, code, .. } if is_refusal(*status, code) => {
            exit::REFUSED
        }
        client::InvokeError::Rejected { .. } | client::InvokeError::GaveUp { .. } => exit::STORAGE,
    }
}

/// Whether a host's answer refuses the request itself, whatever the load: a bad request or
/// token (400, 401), what the tenant may not do or does not have (403, 404, 405, 409), a body
/// over a limit (413), or a segment that can never fit the device. A 408 (the body came too
/// slowly) or another 422 (a time or memory limit, which a busy host or a cold model load may
/// have made the request pass) may pass, and a restart asks again.
fn is_refusal(status: u16, code: &str) -> bool {
    matches!(status, 400 | 401 | 403 | 404 | 405 | 409 | 413)
        || (status == 422 && code == "does_not_fit_device")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(status: u16, code: &str) -> anyhow::Error {
        anyhow::Error::new(client::InvokeError::Rejected {
            host: "http://h".into(),
            status,
            code: code.into(),
            message: "m".into(),
        })
        .context("profile of `m`")
    }

    #[test]
    fn refusals_are_told_from_what_load_may_have_caused() {
        for (status, code) in [
            (401, "bad_token"),
            (404, "function_not_found"),
            (403, "object_denied"),
            (413, "body_too_large"),
            (422, "does_not_fit_device"),
        ] {
            assert_eq!(exit_code(&rejected(status, code)), exit::REFUSED, "{code}");
        }
        for (status, code) in [
            (408, "request_timeout"),
            (422, "time_limit_exceeded"),
            (422, "memory_limit_exceeded"),
            (200, "bad_response"),
        ] {
            assert_eq!(exit_code(&rejected(status, code)), exit::STORAGE, "{code}");
        }
        let gave_up = anyhow::Error::new(client::InvokeError::GaveUp {
            host: "http://h".into(),
            attempts: 3,
            secs: 120.0,
            last: "503".into(),
        });
        assert_eq!(exit_code(&gave_up), exit::STORAGE);
    }
}
