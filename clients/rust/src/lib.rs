//! A client for HAPI's storage tier: `hapi-host`'s HTTP API, with retries. `hapi-train` uses
//! it; so can any Rust program that wants a storage host's features.
//!
//! With several hosts serving the same data, each request goes to the host with the least
//! outstanding work for its measured speed; a host that fails is ejected with backoff and
//! probed through `/healthz` until it returns; a request that fails on one host is retried at
//! once on another; a request a host is slow to answer (4x its usual time) is sent to another
//! host as well and the first answer wins ([`route`]). Transient failures (connection refused or
//! reset, a body cut short, 5xx, 429) are retried until the retry budget is spent, waiting with
//! exponential backoff only when no host is in. Client errors (4xx) are not retried: they name
//! what is wrong.
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
pub use route::HostStats;
use route::{Pick, Router};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long an idle kept-alive connection to a host is kept for reuse: below the host's
/// `header_timeout` (10 s by default), after which the host closes it; a request sent on a
/// connection the host is closing fails (`connection closed before message completed`) and,
/// with several hosts, would eject a healthy host.
pub const POOL_IDLE: Duration = Duration::from_secs(5);

pub mod route;

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
    router: Router,
    token: String,
    function: String,
    http: reqwest::Client,
    retry: RetryPolicy,
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
        /// The host's `Retry-After` (429: busy, not broken).
        after: Option<Duration>,
        /// Index of the host it failed on.
        host: usize,
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
        let hosts: Vec<String> = hosts
            .into_iter()
            .map(|h| h.trim_end_matches('/').to_string())
            .collect();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(POOL_IDLE)
            .build()?;
        Ok(Self {
            router: Router::new(hosts),
            token,
            function,
            http,
            retry,
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
        self.router.hosts()
    }

    /// Retried requests so far (on the same host or another).
    pub fn retries(&self) -> usize {
        self.retries.load(Ordering::Relaxed)
    }

    /// Requests sent to a second host because the first was slow to answer.
    pub fn hedges(&self) -> u64 {
        self.router.hedges()
    }

    /// Each host's record: answers, failures, ejections, measured time per key.
    pub fn host_stats(&self) -> Vec<HostStats> {
        self.router.stats()
    }

    /// Checks that the hosts answer `/healthz`. Those that do not are ejected (and probed
    /// later, as after a failure) and returned; when none answers, the first is the error.
    pub async fn check_reachable(&self) -> Result<Vec<Unreachable>, Unreachable> {
        let mut down = Vec::new();
        for (i, host) in self.router.hosts().iter().enumerate() {
            let res = self
                .http
                .get(format!("{host}/healthz"))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            let message = match res {
                Ok(r) if r.status().is_success() => continue,
                Ok(r) => format!("/healthz answered {}", r.status()),
                Err(e) => error_chain(&e),
            };
            self.router.failed(i, &message);
            down.push(Unreachable {
                host: host.clone(),
                message,
            });
        }
        if down.len() == self.router.hosts().len() {
            return Err(down.swap_remove(0));
        }
        Ok(down)
    }

    /// Each host's local volumes (`GET /v1/placement`), by index into
    /// [`StorageClient::hosts`]: `None` for a host that reads through S3 only or did not
    /// answer.
    pub async fn host_volumes(&self) -> Vec<Option<Vec<u32>>> {
        let asks: Vec<_> = self
            .router
            .hosts()
            .iter()
            .map(|host| {
                let ask = self
                    .http
                    .get(format!("{host}/v1/placement"))
                    .bearer_auth(&self.token)
                    .timeout(Duration::from_secs(2))
                    .send();
                tokio::spawn(async move {
                    match ask.await {
                        Ok(r) if r.status().is_success() => {
                            r.json::<serde_json::Value>().await.ok().and_then(|v| {
                                serde_json::from_value::<Vec<u32>>(v["volumes"].clone()).ok()
                            })
                        }
                        _ => None,
                    }
                })
            })
            .collect();
        let mut out = Vec::with_capacity(asks.len());
        for ask in asks {
            out.push(ask.await.ok().flatten());
        }
        out
    }

    /// Each key's volumes (`POST /v1/placement`): empty where the store does not tell. Asked
    /// of the host with the least outstanding, then the others in turn until one answers.
    pub async fn placement(&self, bucket: &str, keys: &[String]) -> anyhow::Result<Vec<Vec<u32>>> {
        let body = serde_json::json!({"bucket": bucket, "keys": keys});
        let mut last = String::from("no host");
        let hosts = self.router.hosts();
        let first = self.router.least_outstanding();
        for host in (0..hosts.len()).map(|k| &hosts[(first + k) % hosts.len()]) {
            let r = self
                .http
                .post(format!("{host}/v1/placement"))
                .bearer_auth(&self.token)
                .json(&body)
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => {
                    let v: serde_json::Value = r.json().await?;
                    let volumes: Vec<Vec<u32>> = serde_json::from_value(v["volumes"].clone())?;
                    anyhow::ensure!(
                        volumes.len() == keys.len(),
                        "{host}: placement of {} keys answered {}",
                        keys.len(),
                        volumes.len()
                    );
                    return Ok(volumes);
                }
                Ok(r) => last = format!("{host}: {}", r.status()),
                Err(e) => last = format!("{host}: {}", error_chain(&e)),
            }
        }
        anyhow::bail!("no host told the keys' placement (last: {last})")
    }

    /// The host's per-layer profile of `model` (the first host that is in), asking again
    /// while it answers 429 or fails (a 5xx, a lost connection), within the retry policy's
    /// time. A refusal (a 4xx other than 429) is [`InvokeError::Rejected`], and failures past
    /// the retry policy's time [`InvokeError::GaveUp`], as an invocation's are, so that a job
    /// can tell them apart (`hapi-train`'s exit code).
    pub async fn profile(&self, model: &str) -> anyhow::Result<HostProfile> {
        let host = self.router.host(self.router.first_in());
        let started = Instant::now();
        let mut backoff = self.retry.initial;
        let mut attempts = 0;
        let fail = |status: u16, body: &[u8]| {
            serde_json::from_slice::<ErrorBody>(body).map_or_else(
                |_| format!("{status}: {}", String::from_utf8_lossy(body)),
                |e| format!("{status} {}: {}", e.code, e.message),
            )
        };
        let body = loop {
            attempts += 1;
            let sent = self
                .http
                .get(format!("{host}/v1/models/{model}/profile"))
                .bearer_auth(&self.token)
                .send()
                .await;
            let (last, after) = match sent {
                Err(e) => (error_chain(&e), None),
                Ok(resp) => {
                    let status = resp.status();
                    let after = retry_after(&resp);
                    match resp.bytes().await {
                        Err(e) => (error_chain(&e), None),
                        Ok(body) if status.is_success() => break body,
                        // 429: the tenant's slots are all taken (a profile takes one, as an
                        // invocation does) or the model is being loaded; asked again as the
                        // host says. A 5xx may pass too.
                        Ok(body) if status.as_u16() == 429 || status.is_server_error() => {
                            (fail(status.as_u16(), &body), after)
                        }
                        Ok(body) => {
                            let (code, message) = serde_json::from_slice::<ErrorBody>(&body)
                                .map_or_else(
                                    |_| {
                                        let m = String::from_utf8_lossy(&body).into_owned();
                                        ("unknown".to_string(), m)
                                    },
                                    |e| (e.code.to_string(), e.message),
                                );
                            return Err(anyhow::Error::new(InvokeError::Rejected {
                                host: host.to_string(),
                                status: status.as_u16(),
                                code,
                                message,
                            })
                            .context(format!("profile of `{model}`")));
                        }
                    }
                }
            };
            let secs = started.elapsed();
            if secs >= self.retry.give_up_after {
                return Err(anyhow::Error::new(InvokeError::GaveUp {
                    host: host.to_string(),
                    attempts,
                    secs: secs.as_secs_f64(),
                    last,
                })
                .context(format!("profile of `{model}`")));
            }
            tokio::time::sleep(after.unwrap_or(backoff).min(self.retry.max_backoff)).await;
            backoff = (backoff * 2).min(self.retry.max_backoff);
        };
        serde_json::from_slice(&body)
            .map_err(|e| anyhow::anyhow!("{host}: profile of `{model}`: not a profile: {e}"))
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
        self.invoke_preferring(bucket, keys, model, split, &[])
            .await
    }

    /// [`StorageClient::invoke`] on one of the hosts `prefer` while one is in (see
    /// [`StorageClient::call_preferring`]).
    pub async fn invoke_preferring(
        &self,
        bucket: &str,
        keys: &[String],
        model: &str,
        split: usize,
        prefer: &[usize],
    ) -> Result<Features, InvokeError> {
        let body = InvokeRequest {
            bucket: bucket.to_string(),
            keys: keys.to_vec(),
            model: Some(model.to_string()),
            split: Some(u32::try_from(split).unwrap_or(u32::MAX)),
            // f16 and bf16: the function's output type; int8: the host's quantization of its
            // f32 output.
            options: if split > 0 && matches!(self.dtype, WireDtype::F16 | WireDtype::Bf16) {
                [("dtype".to_string(), self.dtype.name().to_string())].into()
            } else {
                Default::default()
            },
            quantize: (split > 0 && self.dtype == WireDtype::Int8)
                .then_some(hapi_wire::invoke::Quantize::Int8),
        };
        self.call_preferring(&body, prefer).await
    }

    /// Sends any invocation (`model` and `split` optional, the function's own options) to the
    /// client's function, retrying transient failures. The function must answer with an f32,
    /// f16 or bf16 tensor (`feature-extract` does); the latter two are widened to f32.
    pub async fn call(&self, body: &InvokeRequest) -> Result<Features, InvokeError> {
        self.call_preferring(body, &[]).await
    }

    /// [`StorageClient::call`], sent to one of the hosts `prefer` (indices into
    /// [`StorageClient::hosts`]: those beside the keys' data) while one of them is in, else to
    /// any host; a hedge may go to any.
    pub async fn call_preferring(
        &self,
        body: &InvokeRequest,
        prefer: &[usize],
    ) -> Result<Features, InvokeError> {
        let keys = &body.keys;
        let started = Instant::now();
        let mut backoff = self.retry.initial;
        let mut attempts = 0u32;
        let mut last = (
            self.router.host(0).to_string(),
            String::from("no attempt yet"),
        );
        loop {
            if attempts > 0 && started.elapsed() >= self.retry.give_up_after {
                return Err(InvokeError::GaveUp {
                    host: last.0,
                    attempts,
                    secs: started.elapsed().as_secs_f64(),
                    last: last.1,
                });
            }
            let lease = match self.router.pick(&self.http, None, prefer) {
                Pick::Host(lease) => lease,
                Pick::Wait(until) => {
                    // Every host is out: wait for a backoff to end (or a probe to answer).
                    let wait = until
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(10))
                        .min(backoff);
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(self.retry.max_backoff);
                    attempts = attempts.max(1);
                    continue;
                }
            };
            attempts += 1;
            if attempts > 1 {
                self.retries.fetch_add(1, Ordering::Relaxed);
            }
            match self.hedged(lease, body, keys).await {
                Attempt::Done(f) => return Ok(f),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { why, after, host } => {
                    last = (self.router.host(host).to_string(), why);
                    // 429: the host is busy, not broken (it stays in): come back when it says,
                    // or after the backoff. A broken host is out already, and the next attempt
                    // goes to another host at once.
                    if let Some(after) = after {
                        let wait = if after.is_zero() { backoff } else { after };
                        tokio::time::sleep(wait.min(self.retry.max_backoff)).await;
                        backoff = (backoff * 2).min(self.retry.max_backoff);
                    }
                }
            }
        }
    }

    /// One attempt on the leased host; if it is slow to answer (see
    /// [`route::Router::hedge_after`]), the same request on another host too, the first
    /// answer winning.
    async fn hedged(&self, lease: route::Lease, body: &InvokeRequest, keys: &[String]) -> Attempt {
        let i = lease.index;
        let sent = Instant::now();
        let primary = self.attempt_on(lease, body, keys);
        let Some(after) = self.router.hedge_after(i, keys.len()) else {
            return primary.await;
        };
        tokio::pin!(primary);
        tokio::select! {
            a = &mut primary => return a,
            () = tokio::time::sleep(after) => {}
        }
        let second = match self.router.pick(&self.http, Some(i), &[]) {
            Pick::Host(l) => l,
            Pick::Wait(_) => return primary.await,
        };
        self.router.hedged();
        let secondary = self.attempt_on(second, body, keys);
        tokio::pin!(secondary);
        tokio::select! {
            a = &mut primary => match a {
                Attempt::Retry { .. } => secondary.await,
                a => a,
            },
            b = &mut secondary => match b {
                Attempt::Done(f) => {
                    self.router.lost_hedge(i, keys.len(), sent.elapsed());
                    Attempt::Done(f)
                }
                Attempt::Retry { .. } => primary.await,
                b => b,
            },
        }
    }

    /// One attempt on the leased host, recorded in its state.
    async fn attempt_on(
        &self,
        lease: route::Lease,
        body: &InvokeRequest,
        keys: &[String],
    ) -> Attempt {
        let i = lease.index;
        let a = self.attempt(i, body, keys).await;
        match &a {
            Attempt::Done(f) => self.router.answered(i, keys.len(), f.wall),
            Attempt::Retry {
                why, after: None, ..
            } => self.router.failed(i, why),
            _ => {}
        }
        a
    }

    /// One request to host `index`.
    async fn attempt(&self, index: usize, body: &InvokeRequest, keys: &[String]) -> Attempt {
        let host = self.router.host(index);
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
                    host: index,
                };
            }
        };
        let status = resp.status();
        let retry_after = retry_after(&resp);
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
                    host: index,
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
            // 429 (busy) says when to come back; a 5xx may not.
            let after = (status.as_u16() == 429).then(|| retry_after.unwrap_or_default());
            return Attempt::Retry {
                why: format!("{host}: {status} {code}: {message}"),
                after,
                host: index,
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

/// The `features` tensor of a safetensors body as f32s (F16 and BF16 widened exactly, I8 with
/// its `features_scale`: [`hapi_wire::quantize::dequantize`]).
pub fn parse_features(body: &[u8]) -> Result<(Vec<i64>, Vec<f32>), String> {
    let st = safetensors::SafeTensors::deserialize(body)
        .map_err(|e| format!("response is not safetensors: {e:?}"))?;
    let t = st
        .tensor("features")
        .map_err(|e| format!("response has no `features` tensor: {e:?}"))?;
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    if t.dtype() == safetensors::Dtype::I8 {
        let s = st.tensor(hapi_wire::quantize::SCALES).map_err(|e| {
            format!(
                "`features` is I8 but the response has no `{}` tensor: {e:?}",
                hapi_wire::quantize::SCALES
            )
        })?;
        if s.dtype() != safetensors::Dtype::F32 {
            return Err(format!(
                "`{}` is {:?}, expected F32",
                hapi_wire::quantize::SCALES,
                s.dtype()
            ));
        }
        let scales = f32s(s.data());
        let values: Vec<i8> = t.data().iter().map(|&b| b as i8).collect();
        let dims: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        let data = hapi_wire::quantize::dequantize(&dims, &scales, &values)?;
        return Ok((shape, data));
    }
    let halves = || {
        t.data()
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    let data = match t.dtype() {
        safetensors::Dtype::F32 => f32s(t.data()),
        safetensors::Dtype::F16 => halves().map(f16_to_f32).collect(),
        safetensors::Dtype::BF16 => halves().map(bf16_to_f32).collect(),
        other => {
            return Err(format!(
                "`features` is {other:?}, expected F32, F16, BF16 or I8 (with scales)"
            ));
        }
    };
    Ok((shape, data))
}

/// Little-endian f32s (a safetensors F32 tensor's data).
fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
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

/// The seconds of a response's `Retry-After` header, when it gives them.
fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// An error with its sources, which is where reqwest says "connection refused".
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
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
