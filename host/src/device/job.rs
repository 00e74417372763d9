//! What goes in and out of the device: a compute call and its result.

use crate::account::{Account, Charge, Deadline, Usage};
use crate::admission::Permit;
use crate::device::budget::Pin;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// A compute call's input: `n` samples of f32 (little-endian bytes), each of `shape`.
#[derive(Debug)]
pub struct Input {
    pub bytes: Vec<u8>,
    /// What the bytes cost the caller's account.
    pub charge: Charge,
    /// Per-sample shape.
    pub shape: Vec<i64>,
    pub n: i64,
}

impl Input {
    /// Bytes of one sample.
    pub fn sample_bytes(&self) -> usize {
        self.bytes.len() / usize::try_from(self.n.max(1)).unwrap_or(1)
    }
}

pub use hapi_wire::tensor::WireDtype;

/// libtorch's kind for a [`WireDtype`]: segments run in f32; the device narrows each call's
/// share of a batch to the call's type before it leaves the device, so a pooled batch can serve
/// callers of different types, and a narrow output is charged at its narrow size.
pub fn torch_kind(d: WireDtype) -> tch::Kind {
    match d {
        WireDtype::F32 => tch::Kind::Float,
        WireDtype::F16 => tch::Kind::Half,
        WireDtype::Bf16 => tch::Kind::BFloat16,
        // Not a graph output type (graph names refuse `@int8`: the host quantizes f32 outputs
        // when it sends them); the size agrees with `WireDtype::size` all the same.
        WireDtype::Int8 => tch::Kind::Int8,
    }
}

/// One compute call: layers `range` of a pinned model on `input`, for a tenant.
#[derive(Debug)]
pub struct Job {
    pub tenant: Arc<str>,
    pub weight: u32,
    pub pin: Pin,
    pub range: Range<usize>,
    pub input: Input,
    /// What the output is delivered as.
    pub out: WireDtype,
    pub account: Arc<Account>,
    pub deadline: Arc<Deadline>,
    /// The tenant's admission slot its invocation runs in, held until the device lets go of
    /// the call (its input, output and model pin): a batch already running when the
    /// invocation stops (its time limit, its client gone) runs to its end, and the tenant's
    /// next call waits for it rather than holding as much again beside it.
    pub slot: Option<Arc<Permit>>,
    /// The invocation's usage: each batch's device time is added as the batch ends, so a call
    /// stopped part way (its time limit, its client gone) is counted for what ran.
    pub usage: Arc<Usage>,
}

/// A finished call: its output and where its time went.
#[derive(Debug)]
pub struct Ran {
    /// `n` samples of the segment's output, little-endian, of the job's [`WireDtype`].
    pub output: Vec<u8>,
    pub charge: Charge,
    /// Output dimensions, batch first.
    pub dims: Vec<i64>,
    /// Waiting for memory, a batch, or other tenants' turns.
    pub queued: Duration,
    /// On the device (a pooled batch's time shared out by samples).
    pub device: Duration,
    /// Device batches the call was part of.
    pub batches: u32,
}
