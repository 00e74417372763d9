//! The operator's policy file (TOML): host settings and, per tenant, what it may do.
//!
//! Parsed into raw types that reject unknown keys (a typo must not silently widen or drop a
//! limit), then validated ([`parse`]) into the types here. Every value has a named range, and
//! every error names the key and its line.
//!
//! ```toml
//! [host]
//! listen = "127.0.0.1:8080"
//! store = "/var/lib/hapi/store"        # a directory whose subdirectories are buckets
//! models = "/var/lib/hapi/models"      # model packages; or several: ["/a", "/b"]
//! measure_at_start = true              # memory models of usable models made before serving
//! state = "/var/lib/hapi/state"        # deployed functions and their compiled code
//! device = "auto"                      # auto | cpu | cuda | cuda:N
//! memory_budget = "4GiB"               # device memory shared by all in-flight work
//! adapt_batch = true                   # split compute calls into sub-batches that fit
//! pool = true                          # merge compute calls across tenants into device batches
//! batch_window = "2ms"                 # how long a pooled batch waits for batch mates
//! max_batch = 32                       # largest pooled device batch (samples)
//! slice = "50ms"                       # longest batch of one tenant's work while others wait
//! batch_time = "300ms"                 # longest pooled batch (several tenants' work)
//! resident_for = "30s"                 # a model used this recently stays, within its tenants' shares
//! max_request = "64MiB"                # largest request body (component uploads)
//! keep_resident = "0"                  # of each guest memory slot, kept resident when freed
//! operator_token_sha256 = "<hex>"      # who may read /metrics (else nobody, on this address)
//! metrics_listen = "127.0.0.1:9090"    # /metrics without a token, on a separate address
//! max_connections = 1024               # open connections, all clients
//! max_connections_per_client = 256     # open connections from one address
//! header_timeout = "10s"               # a request's headers must arrive within this
//! body_timeout = "60s"                 # and its body within this
//! idle_timeout = "60s"                 # a connection that moves no byte for this long is closed
//! shutdown_timeout = "90s"             # on SIGTERM, how long work in flight may take to finish
//!                                      # (default: the longest tenant `timeout` or body_timeout, + 30s)
//! workers = 2                          # threads that run invocations (default: the cores)
//! device_workers = 2                   # device batches run at once (default: CPU the cores, GPU 1);
//!                                      # on a CPU each gets cores / device_workers libtorch threads
//!                                      # (unless OMP_NUM_THREADS is set)
//!
//! [host.s3]                            # with store = "s3://"
//! endpoint = "http://127.0.0.1:8333"   # the S3 service (empty: AWS); plain http allowed
//! region = "us-east-1"
//! access_key_id = "..."                # both or neither (else AWS_ACCESS_KEY_ID / ..._SECRET_...)
//! secret_access_key = "..."
//! seaweedfs_filer = "http://10.0.0.2:8888"       # beside a SeaweedFS volume server, both or
//! local_volume_server = "http://10.0.0.11:8080"  # neither: read the replicas it holds from it
//!
//! [tenants.alice]
//! token_sha256 = "<hex of sha256(token)>"   # `hapi-host hash-token` prints it
//! grants = [{ bucket = "datasets", prefix = "fashion-mnist/" }]
//! models = ["efficientnet_lite0", "resnet18"]        # shared packages it may use
//! private_models = "/var/lib/hapi/tenants/alice"    # packages only alice sees (or a list)
//! memory = "256MiB"      # guest memory and what the host holds for one invocation
//! timeout = "30s"        # wall time of one invocation, host calls included
//! max_output = "64MiB"   # bytes of the response body
//! max_object = "16MiB"   # bytes of one object read
//! max_read = "512MiB"    # bytes read by one invocation
//! concurrency = 4        # invocations at once
//! queue = 8              # invocations waiting for a slot; past it, 429 with Retry-After
//! weight = 1             # share of the device's time
//! deploy = true          # may upload its own functions
//! max_functions = 16     # uploaded functions kept at once
//! max_function_bytes = "64MiB"  # their bytes together, with their compiled code
//! compile_share = 50     # percent of one compile thread its uploads may use over time
//! compile_burst = "60s"  # compile time it may use at once before `compile_share` applies
//! capabilities = []      # extra WASI interfaces: "clocks", "random"
//! [tenants.alice.functions]
//! feature-extract = "/opt/hapi/feature_extract.wasm"   # deployed at start
//! ```
//!
//! With a local store, `state`, `models` and every `private_models` directory must lie outside
//! it (a grant on the bucket of that name would read them) and not hold it (a grant on a
//! bucket would read one of their directories); a reload is checked against the store the
//! host runs with (`store` changes only at a restart); and no `private_models` directory
//! may be a `models` one (each shared package would be the tenant's own); tenants may share a
//! `private_models` directory. A policy that breaks this is refused with the key and line.

pub mod packages;
mod parse;

use crate::locks::{read, write};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Largest guest memory a policy may grant: the whole 32-bit address space.
pub const MAX_GUEST_MEMORY: u64 = 4 << 30;
/// Smallest guest memory: a Rust guest's stack and heap need about this much.
pub const MIN_GUEST_MEMORY: u64 = 1 << 20;
/// Longest invocation a policy may allow.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Most concurrent invocations per tenant (each holds a pooled instance slot).
pub const MAX_CONCURRENCY: u64 = 64;
/// Most invocations a tenant may have waiting for a slot.
pub const MAX_QUEUE: u64 = 1024;
/// Most invocations all tenants may run at once (the sum of their `concurrency`): the engine's
/// instance pool holds that many, so that no tenant within its `concurrency` is refused for a
/// slot other tenants hold (`wasm/engine.rs`).
pub const MAX_INVOCATIONS: usize = 4096;
/// Largest fairness weight.
pub const MAX_WEIGHT: u64 = 1000;
/// Longest a pooled batch may wait for batch mates: every call pays it.
pub const MAX_BATCH_WINDOW: Duration = Duration::from_millis(100);
/// Longest a model stays its tenants' (`host.resident_for`).
pub const MAX_RESIDENT_FOR: Duration = Duration::from_secs(3600);
/// Largest pooled device batch.
pub const MAX_MAX_BATCH: u64 = 4096;
/// Range of the device slice: shorter slices interleave tenants more finely, longer ones
/// batch better.
pub const SLICE_RANGE: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(2));
/// Smallest device memory budget: below this no model here fits.
pub const MIN_MEMORY_BUDGET: u64 = 16 << 20;
/// Most of each guest memory slot kept resident when freed (`host.keep_resident`).
pub const MAX_KEEP_RESIDENT: u64 = 256 << 20;
/// Range of the largest request body (component uploads).
pub const MAX_REQUEST_RANGE: (u64, u64) = (64 << 10, 1 << 30);
/// Range of a tenant's output limit: a safetensors header alone is about 100 bytes.
pub const MAX_OUTPUT_RANGE: (u64, u64) = (1 << 10, 4 << 30);
/// Largest byte cap on object reads (per object and per invocation).
pub const MAX_READ_CAP: u64 = 1 << 40;
/// Most uploaded functions a tenant may keep.
pub const MAX_FUNCTIONS: u64 = 1024;
/// Largest total of a tenant's uploaded functions.
pub const MAX_FUNCTION_BYTES: u64 = 4 << 30;
/// Most compile time a tenant may use at once (`compile_burst`).
pub const MAX_COMPILE_BURST: Duration = Duration::from_secs(3600);
/// Most open connections a policy may allow (each costs a file descriptor).
pub const MAX_CONNECTIONS: u64 = 65_536;
/// Range of the header, body and idle timeouts.
pub const HTTP_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
/// What a stop grants connections beyond the longest tenant `timeout` (or `body_timeout`) by
/// default: the responses of invocations that end at their deadline are sent within it.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(30);
/// Most invocation worker threads.
pub const MAX_WORKERS: u64 = 256;

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
    /// Reading replicas from this node's own SeaweedFS volume server, when set.
    pub locality: Option<Locality>,
}

/// Where a host beside a SeaweedFS volume server finds an object's chunks (the filer) and
/// reads those held locally (the volume server), instead of through the S3 gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locality {
    /// e.g. `http://10.0.0.2:8888`.
    pub filer: String,
    /// e.g. `http://10.0.0.11:8080`.
    pub volume_server: String,
}

/// How the HTTP server treats connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    /// On shutdown, how long connections may take to finish their requests (an invocation in
    /// flight, a response being read) before they are closed: a client reading a response a
    /// byte at a time within `idle_timeout` would otherwise hold the host until its service
    /// manager kills it. Default: the longest tenant `timeout`, or `body_timeout` if longer (an
    /// upload's body), + [`SHUTDOWN_SLACK`]. Read from the policy in force when the stop begins
    /// (a reload changes it). The host's own work in progress then (a compile, a reload) is
    /// given what is left of it, and stopped with the process after.
    pub shutdown_timeout: Duration,
    /// Largest request body (component uploads; invocations have their own, smaller bound).
    pub max_request: usize,
}

/// Connections the metrics listener (`host.metrics_listen`) takes at most: a scraper or two.
pub const METRICS_CONNECTIONS: usize = 16;

impl HttpSettings {
    /// The metrics listener's settings, at most [`METRICS_CONNECTIONS`], where `usable`
    /// connections are what the open-file limit leaves for both listeners: the API listener
    /// keeps its own `max_connections` where both fit, and has as many fewer as it takes where
    /// they do not. Each listener had been allowed all of `usable`, so together they could hold
    /// twice what the host's own files (models, objects, compiled code) left room for, and
    /// those then failed to open for every tenant.
    pub fn split_for_metrics(&mut self, usable: usize) -> Self {
        let metrics = METRICS_CONNECTIONS.min(usable / 2).max(1);
        self.max_connections = self
            .max_connections
            .min(usable.saturating_sub(metrics))
            .max(1);
        self.max_connections_per_client = self.max_connections_per_client.min(self.max_connections);
        Self {
            max_connections: metrics,
            max_connections_per_client: self.max_connections_per_client.min(metrics),
            ..self.clone()
        }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_client: 256,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(60),
            max_request: 64 << 20,
        }
    }
}

#[derive(Debug, Clone)]
pub struct HostSettings {
    pub listen: SocketAddr,
    pub store: StoreLocation,
    /// Directories of shared model packages.
    pub models: Vec<PathBuf>,
    /// Make the memory model of every usable model when starting (and when a reload adds
    /// one), before serving; else at the model's first use.
    pub measure_at_start: bool,
    pub state: PathBuf,
    pub device: String,
    pub memory_budget: u64,
    pub adapt_batch: bool,
    pub pool: bool,
    pub batch_window: Duration,
    pub max_batch: i64,
    /// Longest batch of one tenant's work while others are active (estimated from the memory
    /// model's times).
    pub slice: Duration,
    /// Longest pooled batch (several tenants' work), estimated.
    pub batch_time: Duration,
    /// A model a tenant used within this is kept for it while the tenant holds no more than
    /// its share of `memory_budget` (loads for other tenants do not unload it); 0: plain LRU.
    pub resident_for: Duration,
    /// Bytes of each guest memory slot kept resident (zeroed) when its instance ends, so that
    /// the next instance does not page-fault them in; at most (instances alive at once) x this
    /// stays resident, no tenant's.
    pub keep_resident: u64,
    pub http: HttpSettings,
    /// sha256 of the operator's token, which `/metrics` asks for.
    pub operator_token_sha256: Option<[u8; 32]>,
    /// A separate address serving `/metrics` without a token.
    pub metrics_listen: Option<SocketAddr>,
    /// Threads that run invocations.
    pub workers: usize,
    /// Device batches that run at once; `None`: the cores on a CPU, one on a GPU.
    pub device_workers: Option<usize>,
}

impl HostSettings {
    /// Settings that only take effect at a restart (SIGHUP keeps the running ones): names of
    /// those that differ between `self` and `other`.
    pub fn restart_only_changes(&self, other: &Self) -> Vec<&'static str> {
        let mut changed = Vec::new();
        let mut check = |name, differs: bool| {
            if differs {
                changed.push(name);
            }
        };
        check("listen", self.listen != other.listen);
        check("store", self.store != other.store);
        check("state", self.state != other.state);

        check("device", self.device != other.device);
        check("memory_budget", self.memory_budget != other.memory_budget);
        check("adapt_batch", self.adapt_batch != other.adapt_batch);
        check("pool", self.pool != other.pool);
        check("batch_window", self.batch_window != other.batch_window);
        check("max_batch", self.max_batch != other.max_batch);
        check("slice", self.slice != other.slice);
        check("batch_time", self.batch_time != other.batch_time);
        check("resident_for", self.resident_for != other.resident_for);
        check("keep_resident", self.keep_resident != other.keep_resident);
        // `shutdown_timeout` is read from the policy in force at the stop.
        let restart_only = |h: &HttpSettings| HttpSettings {
            shutdown_timeout: Duration::ZERO,
            ..h.clone()
        };
        check(
            "http",
            restart_only(&self.http) != restart_only(&other.http),
        );
        check(
            "metrics_listen",
            self.metrics_listen != other.metrics_listen,
        );
        check("workers", self.workers != other.workers);
        check(
            "device_workers",
            self.device_workers != other.device_workers,
        );
        changed
    }
}

/// One bucket and key prefix a tenant may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub bucket: String,
    /// Keys must start with this; empty grants the whole bucket.
    pub prefix: String,
}

impl Grant {
    /// The keys it grants, as a prefix: a prefix names a directory, so `data` grants
    /// `data/...`, not `data-secret/...`; empty grants the whole bucket.
    pub fn dir(&self) -> String {
        if self.prefix.is_empty() || self.prefix.ends_with('/') {
            self.prefix.clone()
        } else {
            format!("{}/", self.prefix)
        }
    }
}

/// Per-invocation limits, enforced by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Guest linear memory and everything the host holds for one invocation.
    pub memory: u64,
    pub timeout: Duration,
    /// Bytes of the response body (safetensors header and data).
    pub max_output: u64,
    pub max_object: u64,
    pub max_read: u64,
    pub concurrency: usize,
    /// Invocations that may wait for one of the `concurrency` slots.
    pub queue: usize,
    pub weight: u32,
    /// Uploaded functions kept at once.
    pub max_functions: usize,
    /// Bytes of uploaded functions together, with their compiled code.
    pub max_function_bytes: u64,
    /// Percent of one compile thread the tenant's uploads may use over time.
    pub compile_share: u32,
    /// Compile time the tenant may use at once before [`Limits::compile_share`] applies.
    pub compile_burst: Duration,
}

impl Limits {
    /// The lower of each limit of `self` and `other` (a tenant's `weight`, its share, too).
    pub fn lowest(&self, other: &Limits) -> Limits {
        Limits {
            memory: self.memory.min(other.memory),
            timeout: self.timeout.min(other.timeout),
            max_output: self.max_output.min(other.max_output),
            max_object: self.max_object.min(other.max_object),
            max_read: self.max_read.min(other.max_read),
            concurrency: self.concurrency.min(other.concurrency),
            queue: self.queue.min(other.queue),
            weight: self.weight.min(other.weight),
            max_functions: self.max_functions.min(other.max_functions),
            max_function_bytes: self.max_function_bytes.min(other.max_function_bytes),
            compile_share: self.compile_share.min(other.compile_share),
            compile_burst: self.compile_burst.min(other.compile_burst),
        }
    }
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
            max_functions: 16,
            max_function_bytes: 64 << 20,
            compile_share: 50,
            compile_burst: Duration::from_secs(60),
        }
    }
}

/// WASI interfaces beyond the always-granted minimum, granted per tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    pub clocks: bool,
    pub random: bool,
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub token_sha256: [u8; 32],
    pub grants: Vec<Grant>,
    /// Shared models (from `host.models`) it may use, by name.
    pub models: BTreeSet<String>,
    /// Directories of packages only this tenant sees.
    pub private_models: Vec<PathBuf>,
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

/// A tenant, function, bucket or model name: letters, digits, `-` and `_`, at most 64 bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// The policy in force, which a reload replaces. Running invocations read their tenant from it
/// at every host call that uses a grant, so a reload reaches them there (see
/// [`crate::caps::caller::Caller::tenant_now`]).
#[derive(Debug)]
pub struct Current(RwLock<Arc<Policy>>);

impl Current {
    pub fn new(policy: Arc<Policy>) -> Self {
        Self(RwLock::new(policy))
    }

    pub fn get(&self) -> Arc<Policy> {
        Arc::clone(&read(&self.0))
    }

    pub fn set(&self, policy: Arc<Policy>) {
        *write(&self.0) = policy;
    }
}

impl Tenant {
    /// This tenant as `tenants` (a policy's, maybe one reloaded since it authenticated) has it,
    /// if it is there with the same token: what a call, deploy or removal that authenticated
    /// earlier acts as. `None`: the tenant was removed or its token changed.
    pub fn as_in<'a>(&self, tenants: &'a BTreeMap<String, Arc<Tenant>>) -> Option<&'a Arc<Tenant>> {
        tenants
            .get(&self.name)
            .filter(|now| constant_time_eq(&now.token_sha256, &self.token_sha256))
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Policy {
    /// Invocations all tenants may run at once: the sum of their `concurrency`.
    pub fn invocations(&self) -> usize {
        self.tenants.values().map(|t| t.limits.concurrency).sum()
    }

    /// The tenant whose token hashes to `sha256`.
    pub fn tenant_by_token_hash(&self, sha256: &[u8; 32]) -> Option<&Arc<Tenant>> {
        // Compare every hash in full so the time taken does not depend on where they differ.
        let mut found = None;
        for t in self.tenants.values() {
            if constant_time_eq(&t.token_sha256, sha256) {
                found = Some(t);
            }
        }
        found
    }

    /// `next`'s tenants (who they are, their tokens, grants, models, limits and deploy right)
    /// and operator token, with this policy's other host settings: what a reload applies at
    /// once, before it loads `next`'s functions. Capabilities are linked into functions, so a
    /// change of them waits for those.
    pub fn with_tenants_of(&self, next: &Policy) -> Policy {
        let mut p = self.clone();
        p.tenants.clone_from(&next.tenants);
        p.host.operator_token_sha256 = next.host.operator_token_sha256;
        p
    }

    /// This policy less what `next` revokes, for a reload that could not load `next`'s
    /// functions: tenants it removes are gone, a tenant whose token it changes has the new
    /// token, and so has the operator; each tenant kept has only what both policies give it
    /// (the keys both grant, the shared models both name, the deploy right if both give it,
    /// the lower of each limit); with the names of what changed. (Capabilities are linked into
    /// functions, which stay the old ones; private packages stay as the catalog last read
    /// them.) A failed reload had kept every grant, model and right the new policy took away.
    pub fn revoked_by(&self, next: &Policy) -> (Policy, Vec<String>) {
        let mut changed = Vec::new();
        let mut narrowed = self.clone();
        narrowed.tenants.retain(|name, _| {
            let kept = next.tenants.contains_key(name);
            if !kept {
                changed.push(format!("tenant `{name}` removed"));
            }
            kept
        });
        for (name, t) in &mut narrowed.tenants {
            let n = &next.tenants[name];
            let mut both = Tenant::clone(t);
            if t.token_sha256 != n.token_sha256 {
                both.token_sha256 = n.token_sha256;
                changed.push(format!("tenant `{name}`'s new token"));
            }
            let grants = common_grants(&t.grants, &n.grants);
            if grants != t.grants {
                both.grants = grants;
                changed.push(format!("tenant `{name}`'s grants narrowed"));
            }
            let models: BTreeSet<String> = t.models.intersection(&n.models).cloned().collect();
            if models != t.models {
                both.models = models;
                changed.push(format!("tenant `{name}`'s models narrowed"));
            }
            if t.deploy && !n.deploy {
                both.deploy = false;
                changed.push(format!("tenant `{name}`'s deploy right"));
            }
            let limits = t.limits.lowest(&n.limits);
            if limits != t.limits {
                both.limits = limits;
                changed.push(format!("tenant `{name}`'s lower limits"));
            }
            *t = Arc::new(both);
        }
        if self.host.operator_token_sha256 != next.host.operator_token_sha256 {
            narrowed.host.operator_token_sha256 = next.host.operator_token_sha256;
            changed.push("the operator's new token".into());
        }
        (narrowed, changed)
    }

    /// Whether `sha256` is the operator's token.
    pub fn is_operator(&self, sha256: &[u8; 32]) -> bool {
        self.host
            .operator_token_sha256
            .as_ref()
            .is_some_and(|op| constant_time_eq(op, sha256))
    }
}

/// The grants of keys that both `a` and `b` grant: of two grants on one bucket, the one whose
/// directory is in the other's ([`Grant::dir`]: a key is granted when it starts with it). The
/// prefixes as written compared wrongly: `data-public/` starts with `data`, which grants
/// `data/...` only, so a failed reload that narrowed one to the other kept `data-public/`.
fn common_grants(a: &[Grant], b: &[Grant]) -> Vec<Grant> {
    let mut out: Vec<Grant> = Vec::new();
    for x in a {
        for y in b.iter().filter(|y| y.bucket == x.bucket) {
            let (dx, dy) = (x.dir(), y.dir());
            let inner = if dx.starts_with(&dy) {
                x
            } else if dy.starts_with(&dx) {
                y
            } else {
                continue;
            };
            if !out.contains(inner) {
                out.push(inner.clone());
            }
        }
    }
    out
}

/// sha256 of a token, as hex: what goes in `token_sha256`.
pub fn hash_token(token: &str) -> String {
    hex(&token_digest(token))
}

/// sha256 of a token, as bytes.
pub fn token_digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// sha256 of bytes, as hex (component digests).
pub fn hash_bytes(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(bucket: &str, prefix: &str) -> Grant {
        Grant {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    /// Keys both grant, by directory: `data` grants `data/...` and nothing of `data-public/`,
    /// whichever of the two policies has which.
    #[test]
    fn common_grants_compare_directories() {
        let public = [grant("d", "data-public/")];
        let data = [grant("d", "data")];
        assert_eq!(common_grants(&public, &data), []);
        assert_eq!(common_grants(&data, &public), []);
        // Within each other: the inner one, as written.
        let inner = [grant("d", "data/train")];
        assert_eq!(common_grants(&data, &inner), inner);
        assert_eq!(common_grants(&inner, &data), inner);
        assert_eq!(common_grants(&[grant("d", "")], &public), public);
        assert_eq!(common_grants(&data, &[grant("d", "data/")]), data);
        assert_eq!(common_grants(&data, &[grant("e", "data")]), []);
    }
}
