//! The operator's policy file (TOML): host settings and, per tenant, what it may do.
//!
//! Parsed into a raw type that rejects unknown keys (a typo must not silently widen or drop a
//! limit), then validated into [`Policy`]. Every error names the key and its line.
//!
//! ```toml
//! [host]
//! listen = "127.0.0.1:8080"
//! store = "/var/lib/hapi/store"        # a directory whose subdirectories are buckets
//! models = "/var/lib/hapi/models"      # model packages
//! state = "/var/lib/hapi/state"        # deployed functions and their compiled code
//! device = "auto"                      # auto | cpu | cuda | cuda:N
//! memory_budget = "4GiB"               # device memory shared by all in-flight work
//! adapt_batch = true                   # split compute calls into sub-batches that fit
//! pool = true                          # merge compute calls across tenants into device batches
//! batch_window = "2ms"                 # how long a pooled batch waits for batch mates
//! max_batch = 32                       # largest pooled device batch (samples)
//! max_request = "32MiB"                # largest request body (component uploads)
//!
//! [tenants.alice]
//! token_sha256 = "<hex of sha256(token)>"   # `hapi-host hash-token` prints it
//! grants = [{ bucket = "datasets", prefix = "fashion-mnist/" }]
//! models = ["efficientnet_lite0", "resnet18"]
//! memory = "256MiB"      # guest linear memory
//! timeout = "30s"        # wall time of one invocation
//! max_output = "64MiB"   # bytes of the returned tensor
//! max_object = "16MiB"   # bytes of one object read
//! max_read = "512MiB"    # bytes read by one invocation
//! concurrency = 4        # invocations at once
//! queue = 8              # invocations waiting for a slot; past it, 429 with Retry-After
//! weight = 1             # fair share of the device
//! deploy = true          # may upload its own functions
//! capabilities = []      # extra WASI interfaces: "clocks", "random"
//! [tenants.alice.functions]
//! feature-extract = "/opt/hapi/feature_extract.wasm"   # deployed at start
//! ```

use crate::units::{parse_duration, parse_size};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;

/// Largest guest memory a policy may grant: the whole 32-bit address space.
pub const MAX_GUEST_MEMORY: u64 = 4 << 30;
/// Longest invocation a policy may allow.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Most concurrent invocations per tenant (each holds a pooled instance slot).
pub const MAX_CONCURRENCY: u64 = 64;
/// Most invocations a tenant may have waiting for a slot.
pub const MAX_QUEUE: u64 = 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    host: RawHost,
    #[serde(default)]
    tenants: BTreeMap<String, Spanned<RawTenant>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    listen: Option<Spanned<String>>,
    store: Spanned<String>,
    models: Spanned<String>,
    state: Spanned<String>,
    device: Option<Spanned<String>>,
    memory_budget: Option<Spanned<String>>,
    batch_window: Option<Spanned<String>>,
    adapt_batch: Option<bool>,
    pool: Option<bool>,
    max_batch: Option<Spanned<i64>>,
    max_request: Option<Spanned<String>>,
    s3: Option<RawS3>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawS3 {
    #[serde(default)]
    endpoint: String,
    #[serde(default = "default_region")]
    region: String,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
}

fn default_region() -> String {
    "us-east-1".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    bucket: Spanned<String>,
    #[serde(default)]
    prefix: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    token_sha256: Spanned<String>,
    #[serde(default)]
    grants: Vec<Spanned<RawGrant>>,
    #[serde(default)]
    models: Vec<Spanned<String>>,
    memory: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    max_output: Option<Spanned<String>>,
    max_object: Option<Spanned<String>>,
    max_read: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    queue: Option<Spanned<i64>>,
    weight: Option<Spanned<i64>>,
    deploy: Option<bool>,
    #[serde(default)]
    capabilities: Vec<Spanned<String>>,
    #[serde(default)]
    functions: BTreeMap<String, Spanned<String>>,
}

/// The validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub host: HostSettings,
    pub tenants: BTreeMap<String, Arc<Tenant>>,
}

/// Where objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A directory whose subdirectories are buckets (`store = "/path"` or `"file:///path"`).
    Local(PathBuf),
    /// An S3 service (`store = "s3://"`, settings in `[host.s3]`, credentials there or in
    /// the usual `AWS_*` environment variables).
    S3(S3Settings),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// e.g. `http://127.0.0.1:8333`; empty for AWS itself.
    pub endpoint: String,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

#[derive(Debug, Clone)]
pub struct HostSettings {
    pub listen: SocketAddr,
    pub store: StoreLocation,
    pub models: PathBuf,
    pub state: PathBuf,
    pub device: String,
    pub memory_budget: u64,
    pub adapt_batch: bool,
    pub pool: bool,
    pub batch_window: Duration,
    pub max_batch: i64,
    pub max_request: usize,
}

/// One bucket and key prefix a tenant may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub bucket: String,
    /// Keys must start with this; empty grants the whole bucket.
    pub prefix: String,
}

/// Per-invocation limits, enforced by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub memory: u64,
    pub timeout: Duration,
    pub max_output: u64,
    pub max_object: u64,
    pub max_read: u64,
    pub concurrency: usize,
    /// Invocations that may wait for one of the `concurrency` slots.
    pub queue: usize,
    pub weight: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: 256 << 20,
            timeout: Duration::from_secs(30),
            max_output: 64 << 20,
            max_object: 16 << 20,
            max_read: 512 << 20,
            concurrency: 4,
            queue: 8,
            weight: 1,
        }
    }
}

/// WASI interfaces beyond the always-granted minimum, granted per tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub clocks: bool,
    pub random: bool,
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub token_sha256: [u8; 32],
    pub grants: Vec<Grant>,
    pub models: BTreeSet<String>,
    pub limits: Limits,
    pub deploy: bool,
    pub capabilities: Capabilities,
    /// Functions deployed from files at start: name -> component path.
    pub functions: BTreeMap<String, PathBuf>,
}

/// A policy error: file, line and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct PolicyError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    base: &'a Path,
}

impl Ctx<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    fn err<T>(&self, span: std::ops::Range<usize>, message: String) -> Result<T, PolicyError> {
        Err(PolicyError {
            file: self.file.to_string(),
            line: Some(self.line_of(span.start)),
            message,
        })
    }

    fn size(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
        default: u64,
    ) -> Result<u64, PolicyError> {
        match v {
            None => Ok(default),
            Some(s) => {
                parse_size(s.get_ref()).or_else(|e| self.err(s.span(), format!("{key}: {e}")))
            }
        }
    }

    fn duration(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
        default: Duration,
    ) -> Result<Duration, PolicyError> {
        match v {
            None => Ok(default),
            Some(s) => {
                parse_duration(s.get_ref()).or_else(|e| self.err(s.span(), format!("{key}: {e}")))
            }
        }
    }

    fn path(&self, v: &Spanned<String>) -> PathBuf {
        let p = Path::new(v.get_ref().strip_prefix("file://").unwrap_or(v.get_ref()));
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    /// Like [`Self::int`], but 0 is allowed.
    fn int0(
        &self,
        key: &str,
        v: &Option<Spanned<i64>>,
        default: u64,
        max: u64,
    ) -> Result<u64, PolicyError> {
        self.int_in(key, v, default, 0, max)
    }

    fn int(
        &self,
        key: &str,
        v: &Option<Spanned<i64>>,
        default: u64,
        max: u64,
    ) -> Result<u64, PolicyError> {
        self.int_in(key, v, default, 1, max)
    }

    fn int_in(
        &self,
        key: &str,
        v: &Option<Spanned<i64>>,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, PolicyError> {
        match v {
            None => Ok(default),
            Some(s) => match u64::try_from(*s.get_ref()) {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                _ => self.err(
                    s.span(),
                    format!("{key} = {}: must be {min}..={max}", s.get_ref()),
                ),
            },
        }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Checks a grant prefix or bucket name: relative, no `.`/`..` segments, no backslashes.
pub fn valid_key_part(s: &str) -> bool {
    !s.starts_with('/')
        && !s.contains('\\')
        && !s.contains('\0')
        && s.split('/').all(|seg| seg != "." && seg != "..")
}

impl Policy {
    /// Reads and validates the policy file at `path`. Relative paths in it are relative to
    /// the file's directory.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
            file: file.clone(),
            line: None,
            message: e.to_string(),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&file, &text, base)
    }

    /// Parses policy text; `file` names it in errors.
    pub fn parse(file: &str, text: &str, base: &Path) -> Result<Self, PolicyError> {
        let ctx = Ctx { file, text, base };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| PolicyError {
            file: file.to_string(),
            line: e.span().map(|s| ctx.line_of(s.start)),
            message: e.message().to_string(),
        })?;
        let h = &raw.host;
        let listen = match &h.listen {
            None => SocketAddr::from(([127, 0, 0, 1], 8080)),
            Some(s) => s
                .get_ref()
                .parse()
                .or_else(|e| ctx.err(s.span(), format!("host.listen = {:?}: {e}", s.get_ref())))?,
        };
        let device = match &h.device {
            None => "auto".to_string(),
            Some(s) => {
                let d = s.get_ref();
                let ok = d == "auto"
                    || d == "cpu"
                    || d == "cuda"
                    || d.strip_prefix("cuda:")
                        .is_some_and(|n| n.parse::<u32>().is_ok());
                if !ok {
                    return ctx.err(
                        s.span(),
                        format!("host.device = {d:?}: expected auto, cpu, cuda or cuda:N"),
                    );
                }
                d.clone()
            }
        };
        let max_request = ctx.size("host.max_request", &h.max_request, 32 << 20)?;
        let store = match h.store.get_ref().as_str() {
            "s3://" => {
                let s3 = h.s3.as_ref().map_or_else(
                    || S3Settings {
                        endpoint: String::new(),
                        region: default_region(),
                        access_key_id: None,
                        secret_access_key: None,
                    },
                    |s| S3Settings {
                        endpoint: s.endpoint.clone(),
                        region: s.region.clone(),
                        access_key_id: s.access_key_id.clone(),
                        secret_access_key: s.secret_access_key.clone(),
                    },
                );
                StoreLocation::S3(s3)
            }
            other if other.contains("://") && !other.starts_with("file://") => {
                return ctx.err(
                    h.store.span(),
                    format!("host.store = {other:?}: expected a directory, file:///path or s3://"),
                );
            }
            _ => {
                if h.s3.is_some() {
                    return ctx.err(
                        h.store.span(),
                        "host.s3 is set but host.store is not \"s3://\"".into(),
                    );
                }
                StoreLocation::Local(ctx.path(&h.store))
            }
        };
        let host = HostSettings {
            listen,
            store,
            models: ctx.path(&h.models),
            state: ctx.path(&h.state),
            device,
            memory_budget: ctx.size("host.memory_budget", &h.memory_budget, 4 << 30)?,
            batch_window: ctx.duration(
                "host.batch_window",
                &h.batch_window,
                Duration::from_millis(2),
            )?,
            adapt_batch: h.adapt_batch.unwrap_or(true),
            pool: h.pool.unwrap_or(true),
            max_batch: ctx.int("host.max_batch", &h.max_batch, 32, 4096)? as i64,
            max_request: usize::try_from(max_request).unwrap_or(usize::MAX),
        };

        let mut tenants = BTreeMap::new();
        let mut tokens = BTreeMap::new();
        for (name, t) in &raw.tenants {
            let span = t.span();
            let t = t.get_ref();
            let key = |k: &str| format!("tenants.{name}.{k}");
            if !valid_name(name) {
                return ctx.err(
                    span,
                    format!("tenant name `{name}`: use letters, digits, `-` and `_`"),
                );
            }
            let hex = t.token_sha256.get_ref();
            let token_sha256 = parse_sha256(hex).ok_or(()).or_else(|()| {
                ctx.err(
                    t.token_sha256.span(),
                    format!(
                        "{}: expected 64 hex digits (sha256 of the token)",
                        key("token_sha256")
                    ),
                )
            })?;
            if let Some(other) = tokens.insert(token_sha256, name.clone()) {
                return ctx.err(
                    t.token_sha256.span(),
                    format!("{}: same token as tenant `{other}`", key("token_sha256")),
                );
            }
            let mut grants = Vec::new();
            for g in &t.grants {
                let g = g.get_ref();
                let bucket = g.bucket.get_ref();
                if !valid_name(bucket) {
                    return ctx.err(
                        g.bucket.span(),
                        format!(
                            "{}: bucket `{bucket}`: use letters, digits, `-` and `_`",
                            key("grants")
                        ),
                    );
                }
                let prefix = g
                    .prefix
                    .as_ref()
                    .map(|p| p.get_ref().clone())
                    .unwrap_or_default();
                if !valid_key_part(&prefix) {
                    let span = g.prefix.as_ref().map_or(g.bucket.span(), Spanned::span);
                    return ctx.err(
                        span,
                        format!(
                            "{}: prefix `{prefix}` must be relative, without `.` or `..` segments",
                            key("grants")
                        ),
                    );
                }
                grants.push(Grant {
                    bucket: bucket.clone(),
                    prefix,
                });
            }
            let mut models = BTreeSet::new();
            for m in &t.models {
                models.insert(m.get_ref().clone());
            }
            let d = Limits::default();
            let memory = ctx.size(&key("memory"), &t.memory, d.memory)?;
            if !(1 << 20..=MAX_GUEST_MEMORY).contains(&memory) {
                let span = t.memory.as_ref().map_or(span.clone(), Spanned::span);
                return ctx.err(span, format!("{}: must be 1MiB..=4GiB", key("memory")));
            }
            let timeout = ctx.duration(&key("timeout"), &t.timeout, d.timeout)?;
            if timeout > MAX_TIMEOUT || timeout.is_zero() {
                let span = t.timeout.as_ref().map_or(span.clone(), Spanned::span);
                return ctx.err(
                    span,
                    format!("{}: must be more than 0 and at most 1h", key("timeout")),
                );
            }
            let limits = Limits {
                memory,
                timeout,
                max_output: ctx.size(&key("max_output"), &t.max_output, d.max_output)?,
                max_object: ctx.size(&key("max_object"), &t.max_object, d.max_object)?,
                max_read: ctx.size(&key("max_read"), &t.max_read, d.max_read)?,
                concurrency: ctx.int(
                    &key("concurrency"),
                    &t.concurrency,
                    d.concurrency as u64,
                    MAX_CONCURRENCY,
                )? as usize,
                queue: ctx.int0(&key("queue"), &t.queue, d.queue as u64, MAX_QUEUE)? as usize,
                weight: ctx.int(&key("weight"), &t.weight, u64::from(d.weight), 1000)? as u32,
            };
            let mut capabilities = Capabilities::default();
            for c in &t.capabilities {
                match c.get_ref().as_str() {
                    "clocks" => capabilities.clocks = true,
                    "random" => capabilities.random = true,
                    other => {
                        return ctx.err(
                            c.span(),
                            format!(
                                "{}: unknown capability `{other}` (known: clocks, random)",
                                key("capabilities")
                            ),
                        );
                    }
                }
            }
            let mut functions = BTreeMap::new();
            for (fname, path) in &t.functions {
                if !valid_name(fname) {
                    return ctx.err(
                        path.span(),
                        format!(
                            "{}: function name `{fname}`: use letters, digits, `-` and `_`",
                            key("functions")
                        ),
                    );
                }
                functions.insert(fname.clone(), ctx.path(path));
            }
            tenants.insert(
                name.clone(),
                Arc::new(Tenant {
                    name: name.clone(),
                    token_sha256,
                    grants,
                    models,
                    limits,
                    deploy: t.deploy.unwrap_or(false),
                    capabilities,
                    functions,
                }),
            );
        }
        Ok(Policy { host, tenants })
    }

    /// The tenant whose token hashes to `sha256`.
    pub fn tenant_by_token_hash(&self, sha256: &[u8; 32]) -> Option<&Arc<Tenant>> {
        // Compare every hash in full so the time taken does not depend on where they differ.
        self.tenants.values().find(|t| {
            t.token_sha256
                .iter()
                .zip(sha256)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        })
    }
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// sha256 of a token, as hex: what goes in `token_sha256`.
pub fn hash_token(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// sha256 of a token, as bytes.
pub fn token_digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// sha256 of bytes, as hex (component digests).
pub fn hash_bytes(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
