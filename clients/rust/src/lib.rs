//! A client for HAPI's storage tier: `hapi-host`'s HTTP API, with retries. `hapi-train` uses
//! it; so can any Rust program that wants a storage host's features.
//!
//! Transient failures (connection refused or reset, a body cut short, 5xx, 429) are retried
//! with exponential backoff, on the next host when there are several, until the retry budget
//! is spent. Client errors (4xx) are not retried: they name what is wrong.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use hapi_client::{RetryPolicy, StorageClient};
//! let client = StorageClient::new(
//!     vec!["http://127.0.0.1:8080".into()],
//!     "demo-token".into(),
//!     "feature-extract".into(),
//!     RetryPolicy::default(),
//! )?;
//! client.check_reachable().await?;
//! let keys = vec!["fashion-mnist/test/09_ankle_boot/00000.png".to_string()];
//! // Layers [0, 25) of EfficientNet-Lite0, on the storage host.
//! let f = client.invoke("datasets", &keys, "efficientnet_lite0", 25).await?;
//! println!("{:?}: {} bytes, host compute {:?}", f.shape, f.bytes, f.server);
//! # Ok(())
//! # }
//! ```

/// The element type features travel in (the wire contract's type).
pub use hapi_wire::tensor::WireDtype;
use hapi_wire::{ErrorBody, ErrorCode, InvokeRequest};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long and how often to retry transient failures.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max_backoff: Duration,
    /// Give up when a request has failed for this long.
    pub give_up_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            give_up_after: Duration::from_secs(120),
        }
    }
}

/// Why an invocation failed for good.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// An object could not be read or decoded; `key` is the one the host named.
    #[error("object `{key}`: {message}")]
    BadObject { key: String, message: String },
    /// The host refused the request (4xx other than 429); retrying would not help.
    #[error("{host} refused the request ({status} {code}): {message}")]
    Rejected {
        host: String,
        status: u16,
        code: String,
        message: String,
    },
    /// Transient failures went on past the retry budget.
    #[error(
        "storage host {host} kept failing for {secs:.0} s ({attempts} attempts); last error: {last}"
    )]
    GaveUp {
        host: String,
        attempts: u32,
        secs: f64,
        last: String,
    },
}

/// A storage host could not be reached when the job started.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach storage host {host}: {message} (is `hapi-host serve` running there?)")]
pub struct Unreachable {
    pub host: String,
    pub message: String,
}

/// The host's `Server-Timing` stages, in seconds (the wire contract's type).
pub use hapi_wire::ServerTiming;

/// One invocation's output.
#[derive(Debug)]
pub struct Features {
    /// Batch first.
    pub shape: Vec<i64>,
    pub data: Vec<f32>,
    /// Response body bytes.
    pub bytes: u64,
    pub server: ServerTiming,
    /// From sending the request to having the whole body.
    pub wall: Duration,
    /// Parsing the safetensors body into floats.
    pub deserialize: Duration,
}

/// The profile endpoint's answer (the wire contract's type).
pub use hapi_wire::profile::ModelProfile as HostProfile;

/// A client for one or more storage hosts serving the same data.
#[derive(Debug)]
pub struct StorageClient {
    hosts: Vec<String>,
    token: String,
    function: String,
    http: reqwest::Client,
    retry: RetryPolicy,
    next: AtomicUsize,
    /// Requests retried so far.
    retries: AtomicUsize,
    /// Element type [`StorageClient::invoke`] asks for at splits >= 1.
    dtype: WireDtype,
}

enum Attempt {
    Done(Features),
    Fatal(InvokeError),
    Retry {
        why: String,
        after: Option<Duration>,
    },
}

impl StorageClient {
    pub fn new(
        hosts: Vec<String>,
        token: String,
        function: String,
        retry: RetryPolicy,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!hosts.is_empty(), "no storage host given (--host URL)");
        let hosts = hosts
            .into_iter()
            .map(|h| h.trim_end_matches('/').to_string())
            .collect();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            hosts,
            token,
            function,
            http,
            retry,
            next: AtomicUsize::new(0),
            retries: AtomicUsize::new(0),
            dtype: WireDtype::F32,
        })
    }

    /// Asks for features in `dtype` at splits >= 1 (split 0, the preprocessed input, stays f32).
    #[must_use]
    pub fn with_dtype(mut self, dtype: WireDtype) -> Self {
        self.dtype = dtype;
        self
    }

    pub fn dtype(&self) -> WireDtype {
        self.dtype
    }

    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Retried requests so far.
    pub fn retries(&self) -> usize {
        self.retries.load(Ordering::Relaxed)
    }

    /// Checks that every host answers `/healthz`; the first that does not is the error.
    pub async fn check_reachable(&self) -> Result<(), Unreachable> {
        for host in &self.hosts {
            let res = self
                .http
                .get(format!("{host}/healthz"))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            match res {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => {
                    return Err(Unreachable {
                        host: host.clone(),
                        message: format!("/healthz answered {}", r.status()),
                    });
                }
                Err(e) => {
                    return Err(Unreachable {
                        host: host.clone(),
                        message: error_chain(&e),
                    });
                }
            }
        }
        Ok(())
    }

    /// The host's per-layer profile of `model` (first host).
    pub async fn profile(&self, model: &str) -> anyhow::Result<HostProfile> {
        let host = &self.hosts[0];
        let resp = self
            .http
            .get(format!("{host}/v1/models/{model}/profile"))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{host}: profile of `{model}`: {}", error_chain(&e)))?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<ErrorBody>(&body).map_or_else(
                |_| String::from_utf8_lossy(&body).into_owned(),
                |e| format!("{}: {}", e.code, e.message),
            );
            anyhow::bail!("{host}: profile of `{model}`: {status}: {msg}");
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// Runs the pushdown function on `keys` with layers [0, `split`) of `model`, retrying
    /// transient failures. At splits >= 1 the features travel in the client's
    /// [`WireDtype`] and arrive widened to f32.
    pub async fn invoke(
        &self,
        bucket: &str,
        keys: &[String],
        model: &str,
        split: usize,
    ) -> Result<Features, InvokeError> {
        let body = InvokeRequest {
            bucket: bucket.to_string(),
            keys: keys.to_vec(),
            model: Some(model.to_string()),
            split: Some(u32::try_from(split).unwrap_or(u32::MAX)),
            options: if split > 0 && self.dtype != WireDtype::F32 {
                [("dtype".to_string(), self.dtype.name().to_string())].into()
            } else {
                Default::default()
            },
        };
        self.call(&body).await
    }

    /// Sends any invocation (`model` and `split` optional, the function's own options) to the
    /// client's function, retrying transient failures. The function must answer with an f32,
    /// f16 or bf16 tensor (`feature-extract` does); the latter two are widened to f32.
    pub async fn call(&self, body: &InvokeRequest) -> Result<Features, InvokeError> {
        let keys = &body.keys;
        let started = Instant::now();
        let mut backoff = self.retry.initial;
        let mut attempts = 0u32;
        loop {
            let host = &self.hosts[self.next.fetch_add(1, Ordering::Relaxed) % self.hosts.len()];
            attempts += 1;
            match self.attempt(host, body, keys).await {
                Attempt::Done(f) => return Ok(f),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { why, after } => {
                    if started.elapsed() >= self.retry.give_up_after {
                        return Err(InvokeError::GaveUp {
                            host: host.clone(),
                            attempts,
                            secs: started.elapsed().as_secs_f64(),
                            last: why,
                        });
                    }
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    let wait = after.unwrap_or(backoff).min(self.retry.max_backoff);
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(self.retry.max_backoff);
                }
            }
        }
    }

    async fn attempt(&self, host: &str, body: &InvokeRequest, keys: &[String]) -> Attempt {
        let sent = Instant::now();
        let resp = match self
            .http
            .post(format!("{host}/v1/invoke/{}", self.function))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return Attempt::Retry {
                    why: format!("{host}: {}", error_chain(&e)),
                    after: None,
                };
            }
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs);
        let timing = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .map(ServerTiming::parse)
            .unwrap_or_default();
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Attempt::Retry {
                    why: format!("{host}: reading the response: {}", error_chain(&e)),
                    after: None,
                };
            }
        };
        let wall = sent.elapsed();
        if status.is_success() {
            let t = Instant::now();
            return match parse_features(&bytes) {
                Ok((shape, data)) => Attempt::Done(Features {
                    shape,
                    data,
                    bytes: bytes.len() as u64,
                    server: timing,
                    wall,
                    deserialize: t.elapsed(),
                }),
                Err(message) => Attempt::Fatal(InvokeError::Rejected {
                    host: host.to_string(),
                    status: status.as_u16(),
                    code: "bad_response".into(),
                    message,
                }),
            };
        }
        let error = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or_else(|_| ErrorBody {
            code: ErrorCode::Unknown,
            message: String::from_utf8_lossy(&bytes).into_owned(),
            key: None,
            request_id: None,
        });
        let ErrorBody {
            code, message, key, ..
        } = error;
        if status.as_u16() == 429 || status.is_server_error() || code.retryable() {
            return Attempt::Retry {
                why: format!("{host}: {status} {code}: {message}"),
                after: retry_after,
            };
        }
        // The host names the object an error is about; it must be one of ours.
        if let Some(key) = key.filter(|k| code.is_about_an_object() && keys.contains(k)) {
            return Attempt::Fatal(InvokeError::BadObject {
                key,
                message: format!("{code}: {message}"),
            });
        }
        Attempt::Fatal(InvokeError::Rejected {
            host: host.to_string(),
            status: status.as_u16(),
            code: code.to_string(),
            message,
        })
    }
}

/// The `features` tensor of a safetensors body as f32s (F16 and BF16 widened exactly).
pub fn parse_features(body: &[u8]) -> Result<(Vec<i64>, Vec<f32>), String> {
    let st = safetensors::SafeTensors::deserialize(body)
        .map_err(|e| format!("response is not safetensors: {e:?}"))?;
    let t = st
        .tensor("features")
        .map_err(|e| format!("response has no `features` tensor: {e:?}"))?;
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let halves = || {
        t.data()
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    let data = match t.dtype() {
        safetensors::Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        safetensors::Dtype::F16 => halves().map(f16_to_f32).collect(),
        safetensors::Dtype::BF16 => halves().map(bf16_to_f32).collect(),
        other => {
            return Err(format!(
                "`features` is {other:?}, expected F32, F16 or BF16"
            ));
        }
    };
    Ok((shape, data))
}

/// An IEEE 754 half as f32 (exact: every half is an f32).
pub fn f16_to_f32(h: u16) -> f32 {
    let negative = h & 0x8000 != 0;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let magnitude = match exp {
        // Zero and subnormals: man x 2^-24.
        0 => man as f32 * (1.0 / 16_777_216.0),
        0x1f if man == 0 => f32::INFINITY,
        0x1f => f32::from_bits(0x7fc0_0000 | (man << 13)),
        e => f32::from_bits(((e + 127 - 15) << 23) | (man << 13)),
    };
    if negative { -magnitude } else { magnitude }
}

/// A bfloat16 as f32 (exact: it is an f32's upper half).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// An error with its sources, which is where reqwest says "connection refused".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let m = inner.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_that_are_not_safetensors_are_an_error() {
        assert!(parse_features(b"not a tensor").is_err());
    }

    #[test]
    fn halves_widen_exactly() {
        for (h, v) in [
            (0x0000, 0.0),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x7bff, 65504.0),
            (0x0400, 6.103_515_6e-5),
            (0x0001, 5.960_464_5e-8),
            (0x83ff, -6.097_555e-5),
            (0x7c00, f32::INFINITY),
            (0xfc00, f32::NEG_INFINITY),
        ] {
            assert_eq!(f16_to_f32(h), v, "{h:#06x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc0a0), -5.0);
    }
}
