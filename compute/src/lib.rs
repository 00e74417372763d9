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
    /// The storage tier refused a request outright (a 4xx other than 429: a wrong token, a
    /// function or model the tenant does not have, a request over its limits): asking again
    /// would get the same answer, so a service manager should not restart the job.
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
        client::InvokeError::Rejected { status, .. } if (400..500).contains(status) => {
            exit::REFUSED
        }
        client::InvokeError::Rejected { .. } | client::InvokeError::GaveUp { .. } => exit::STORAGE,
    }
}
