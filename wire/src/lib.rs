//! The contract between HAPI's two tiers: what the trainer (`hapi-train`) sends the storage
//! host (`hapi-host`) and what comes back.
//!
//! Both sides use these types, so a field or an error code cannot drift between them: the host
//! serialises them, the trainer deserialises the same definitions and never parses message
//! text.
//!
//! - [`invoke`]: the body of `POST /v1/invoke/{function}` and the bounds every field obeys;
//! - [`error`]: the JSON error body and its stable codes, each with its HTTP status;
//! - [`timing`]: the `Server-Timing` stages of an invocation;
//! - [`profile`]: per-layer time, output size and memory of a model on the host's device;
//! - [`tensor`]: the safetensors encoding of a response's `features` tensor;
//! - [`units`]: sizes and durations as operators write them, parsed alike on both tiers.

pub mod error;
pub mod invoke;
pub mod profile;
pub mod quantize;
pub mod tensor;
pub mod timing;
pub mod units;

pub use error::{ErrorBody, ErrorCode};
pub use invoke::InvokeRequest;
pub use timing::{ServerTiming, Stage};
