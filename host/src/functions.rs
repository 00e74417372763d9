//! Tenants' functions: deployed from the policy (the operator's, managed) or uploaded through
//! the API, kept under the state directory, compiled once.
//!
//! Every file is reached through one cap-std handle on the state directory, by names that are
//! checked first (tenant and function names are letters, digits, `-` and `_`), so no request
//! can touch a file outside `functions/<tenant>/` and `compiled/<tenant>/`. Uploads are checked
//! before they are compiled ([`compile::check`]), against the tenant's quota of functions and
//! bytes, and compiled off the request path, [`COMPILES_AT_ONCE`] at a time, with at most one
//! upload per tenant in progress (from before its bytes are read to the end of its compile) and
//! [`MAX_COMPILE_QUEUE`] waiting or compiling in all. Compiled code is cached per tenant (nothing about one tenant's uploads can
//! be learnt from another's timings) and removed with the last function that used it.

use crate::account::text::quote;
use crate::locks::{lock, read, write};
use crate::metrics::Metrics;
use crate::policy::{Policy, Tenant, hash_bytes, valid_name};
use crate::wasm::compile::{self, DeployError};
use crate::wasm::invoke::{Prepared, Runtime, allowed_imports};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use hapi_wire::ErrorCode;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// What uploaded functions (the policy's left out) take: how many, their Wasm bytes, and their
/// compiled code's bytes (once per distinct upload), with `extra` compiled code (a digest and
/// its bytes) counted as well.
fn footprint<'a>(
    fns: impl Iterator<Item = &'a Function>,
    held: impl Iterator<Item = &'a Function>,
    extra: Option<(&'a str, u64)>,
) -> (usize, u64, u64) {
    let (mut count, mut wasm) = (0, 0u64);
    let mut codes: HashMap<&str, u64> = HashMap::new();
    for f in fns.filter(|f| !f.managed) {
        count += 1;
        wasm += f.size as u64;
        codes.insert(&f.sha256, f.code_size);
    }
    // Replaced or removed, but still running: their compiled code is still in memory.
    for f in held {
        codes.insert(&f.sha256, f.code_size);
    }
    if let Some((sha256, bytes)) = extra {
        codes.insert(sha256, bytes);
    }
    (count, wasm, codes.values().sum())
}

/// Uploads waiting to be compiled, all tenants together; past this, 429.
pub const MAX_COMPILE_QUEUE: usize = 8;
/// Uploads compiled at once. With one tenant allowed one upload in the queue, two at once mean
/// that a tenant's small upload shares the compiler with, rather than waits behind, another
/// tenant's largest one.
pub const COMPILES_AT_ONCE: usize = 2;

/// A deployed function.
#[derive(Debug)]
pub struct Function {
    pub name: String,
    pub sha256: String,
    pub size: usize,
    /// Bytes of its compiled code (kept in the state directory; functions of a tenant with the
    /// same bytes share it).
    pub code_size: u64,
    /// Deployed by the operator's policy: the API cannot replace or remove it.
    pub managed: bool,
    pub prepared: Prepared,
}

/// Why a function could not be deployed or removed.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    #[error("function name `{0}`: use letters, digits, `-` and `_` (at most 64)")]
    BadName(String),
    #[error("tenant `{tenant}` has no function `{name}`")]
    NotFound { tenant: String, name: String },
    #[error(
        "function `{0}` is deployed by the operator's policy; the API cannot replace or remove it"
    )]
    Managed(String),
    #[error("{0}")]
    Quota(String),
    #[error("{0}")]
    Busy(String),
    /// A reload while the upload compiled took the tenant's right to deploy (or the tenant).
    #[error("{0}")]
    NotAllowed(String),
    /// A reload since the request was authenticated removed the tenant or changed its token.
    #[error("{0}")]
    Revoked(String),
    #[error("function `{name}`: {error}")]
    Bad { name: String, error: DeployError },
    /// The host could not store or compile it (its own fault).
    #[error("{0}")]
    Host(String),
}

impl FunctionError {
    /// The wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BadName(_) => ErrorCode::BadName,
            Self::NotFound { .. } => ErrorCode::FunctionNotFound,
            Self::Managed(_) => ErrorCode::FunctionManagedByPolicy,
            Self::Quota(_) => ErrorCode::QuotaExceeded,
            Self::Busy(_) => ErrorCode::DeployBusy,
            Self::NotAllowed(_) => ErrorCode::DeployNotAllowed,
            Self::Revoked(_) => ErrorCode::BadToken,
            Self::Bad { .. } => ErrorCode::BadComponent,
            Self::Host(_) => ErrorCode::HostFault,
        }
    }
}

/// A deploy or removal whose tenant a reload removed, or gave another token, meanwhile.
fn revoked(tenant: &str, name: &str, what: &str) -> FunctionError {
    FunctionError::Revoked(format!(
        "the policy was reloaded since this request was authenticated, and its token no longer belongs to tenant `{tenant}`: function `{name}` was not {what}"
    ))
}

type Table = BTreeMap<String, BTreeMap<String, Arc<Function>>>;

#[derive(Debug, Default)]
struct Queue {
    /// Uploads waiting for the compiler or being compiled.
    waiting: usize,
    /// Tenants with an upload in progress.
    tenants: HashSet<String>,
    /// Compile time each tenant has not yet paid back.
    owed: HashMap<String, Owed>,
}

/// Compile time a tenant owes: what its compiles took, less its `compile_share` of the wall
/// time since. Past its `compile_burst`, its uploads are refused until it is paid back.
#[derive(Debug, Clone, Copy)]
struct Owed {
    seconds: f64,
    at: Instant,
}

impl Queue {
    /// Whether an upload may join the queue ([`MAX_COMPILE_QUEUE`] waiting or compiling).
    fn has_room(&self) -> Result<(), FunctionError> {
        if self.waiting >= MAX_COMPILE_QUEUE {
            return Err(FunctionError::Busy(format!(
                "{MAX_COMPILE_QUEUE} uploads are waiting to be compiled; retry later"
            )));
        }
        Ok(())
    }

    /// What `tenant` owes at `now`.
    fn owed(&mut self, tenant: &Tenant, now: Instant) -> f64 {
        let share = f64::from(tenant.limits.compile_share) / 100.0;
        self.owed.get_mut(&tenant.name).map_or(0.0, |o| {
            let paid = share * now.saturating_duration_since(o.at).as_secs_f64();
            o.seconds = (o.seconds - paid).max(0.0);
            o.at = now;
            o.seconds
        })
    }

    /// Charges `tenant` a compile of `spent`.
    fn charge(&mut self, tenant: &Tenant, spent: Duration) {
        let now = Instant::now();
        let seconds = self.owed(tenant, now) + spent.as_secs_f64();
        self.owed
            .insert(tenant.name.clone(), Owed { seconds, at: now });
    }
}

/// The functions of every tenant.
#[derive(Debug)]
pub struct Functions {
    state: Arc<Dir>,
    table: RwLock<Table>,
    queue: Arc<Mutex<Queue>>,
    compiler: Arc<tokio::sync::Semaphore>,
    /// The tenants of the policy the table was last loaded from (after a reload that failed,
    /// the old policy's less what the new one revokes). Whoever changes the table
    /// holds it: a reload for its whole run, a deploy from its check against the policy to its
    /// entry in the table, an undeploy. So an upload that compiled under a policy reloaded since
    /// is held to the new one, and no deploy or removal is undone by a reload that read the
    /// state directory before it.
    writers: Mutex<BTreeMap<String, Arc<Tenant>>>,
    /// Uploads replaced or removed while calls ran on them, by tenant: their compiled code
    /// stays in memory until the last of those calls ends, and counts against the tenant's
    /// quota until then (else a tenant could keep a version of its largest upload running per
    /// slot, each outside the quota).
    retired: Mutex<HashMap<String, Vec<Weak<Function>>>>,
}

/// A tenant's one upload in progress, from before its bytes are read to the end of its
/// compile; given back when dropped. Taken before the body is read, so a tenant holds at most
/// one upload's bytes at once, whatever number of connections it opens.
#[derive(Debug)]
pub struct Reservation {
    queue: Arc<Mutex<Queue>>,
    tenant: String,
    name: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.queue).tenants.remove(&self.tenant);
    }
}

/// A place in the compile queue, left when dropped. The compile itself holds it (with its
/// reservation and its turn at the compiler), so an upload whose client goes away keeps its
/// place until its compile ends: hanging up cannot start compiles past the queue's bounds.
struct Queued {
    queue: Arc<Mutex<Queue>>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        lock(&self.queue).waiting -= 1;
    }
}

impl Functions {
    /// Opens (creating) the state directory.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(path)?;
        let state = Dir::open_ambient_dir(path, ambient_authority())?;
        state.create_dir_all("functions")?;
        state.create_dir_all("compiled")?;
        Ok(Self {
            state: Arc::new(state),
            table: RwLock::default(),
            queue: Arc::default(),
            compiler: Arc::new(tokio::sync::Semaphore::new(COMPILES_AT_ONCE)),
            writers: Mutex::default(),
            retired: Mutex::default(),
        })
    }

    /// Uploads waiting for the compiler or being compiled, all tenants together.
    pub fn compiling(&self) -> usize {
        lock(&self.queue).waiting
    }

    pub fn get(&self, tenant: &str, name: &str) -> Option<Arc<Function>> {
        let t = read(&self.table);
        t.get(tenant)?.get(name).cloned()
    }

    pub fn list(&self, tenant: &str) -> Vec<Arc<Function>> {
        let t = read(&self.table);
        t.get(tenant)
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default()
    }

    fn cache_name(runtime: &Runtime, sha256: &str) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        runtime
            .engine()
            .precompile_compatibility_hash()
            .hash(&mut h);
        format!("{sha256}-{:016x}.cwasm", h.finish())
    }

    /// Where `tenant`'s compiled code of `sha256` is kept in the state directory.
    fn code_file(runtime: &Runtime, tenant: &str, sha256: &str) -> String {
        format!("compiled/{tenant}/{}", Self::cache_name(runtime, sha256))
    }

    /// Writes `component`, the compiled code of `tenant`'s function `name`, to `file` (a
    /// [`Self::code_file`]); a failure is logged: it costs a compile at the next start.
    fn keep_code(
        &self,
        tenant: &str,
        name: &str,
        file: &str,
        component: &wasmtime::component::Component,
    ) {
        let written = component
            .serialize()
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|code| self.write(&format!("compiled/{tenant}"), file, &code));
        if let Err(e) = written {
            tracing::warn!("not caching compiled code of `{name}` at {file}: {e}");
        }
    }

    /// Checks, compiles (or loads the tenant's cached code) and prepares `bytes` (blocking).
    /// `loading`: the tenant's functions built so far by a reload, whose code it shares too.
    fn build(
        &self,
        runtime: &Runtime,
        tenant: &Tenant,
        name: &str,
        bytes: &[u8],
        managed: bool,
        loading: &BTreeMap<String, Arc<Function>>,
    ) -> Result<Function, FunctionError> {
        let bad = |error| FunctionError::Bad {
            name: name.to_string(),
            error,
        };
        let caps = tenant.capabilities;
        compile::check(bytes, &tenant.name, &allowed_imports(caps)).map_err(bad)?;
        let sha256 = hash_bytes(bytes);
        let cached = Self::code_file(runtime, &tenant.name, &sha256);
        // The tenant's functions of these bytes share one compiled image in memory, as the
        // quota counts it once: each deserialized copy was an image of its own, so the same
        // bytes under many names (or deployed again and again while calls held the old copy,
        // or removed and uploaded again) took many times the code the quota allowed.
        let same = |fns: &BTreeMap<String, Arc<Function>>| {
            fns.values()
                .find(|f| f.sha256 == sha256)
                .map(|f| f.prepared.component().clone())
        };
        let loaded = same(loading)
            .or_else(|| read(&self.table).get(&tenant.name).and_then(same))
            .or_else(|| {
                // Replaced or removed, but calls still run on it: the quota counts its code
                // once per digest, so bytes removed and uploaded again must not load a second
                // image beside it.
                self.still_running(&tenant.name)
                    .into_iter()
                    .find(|f| f.sha256 == sha256)
                    .map(|f| f.prepared.component().clone())
            });
        let from_cache = loaded.or_else(|| {
            self.state.read(&cached).ok().and_then(|code| {
                // SAFETY: the file was written by `Component::serialize` of an engine with the same
                // compatibility hash, into the host's own state directory, which only the host
                // writes.
                unsafe { wasmtime::component::Component::deserialize(runtime.engine(), &code) }
                    .map_err(|e| tracing::warn!("ignoring compiled code {cached}: {e}"))
                    .ok()
            })
        });
        let (component, fresh) = match from_cache {
            Some(c) => (c, false),
            None => (
                compile::compile(runtime.engine(), bytes).map_err(bad)?,
                true,
            ),
        };
        // The compiled image the host holds for it (what `serialize` writes, and a cached
        // file holds), counted whether or not it could be written.
        let image = component.image_range();
        let code_size = image.end.addr().saturating_sub(image.start.addr()) as u64;
        let prepared = runtime
            .prepare(caps, &component, (&tenant.name, &sha256))
            .map_err(bad)?;
        // Cached only once it is known to implement the world: code that does not is never
        // kept (nothing would remove it).
        if fresh {
            self.keep_code(&tenant.name, name, &cached, &component);
        }
        Ok(Function {
            name: name.to_string(),
            sha256,
            size: bytes.len(),
            code_size,
            managed,
            prepared,
        })
    }

    /// Writes `path` atomically and durably (a temporary file, synced, renamed, and the
    /// directory synced: an upload answered 201 is there after a power loss).
    fn write(&self, dir: &str, path: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.state.create_dir_all(dir)?;
        let tmp = format!("{path}.tmp");
        let mut f = self.state.create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        self.state.rename(&tmp, &self.state, path)?;
        self.sync_dir(dir);
        Ok(())
    }

    /// Syncs directory `dir` (after a file is renamed into it or removed from it), so that the
    /// change survives a power loss. A failure is logged: the change itself was made, and an
    /// error here would answer it as not made.
    fn sync_dir(&self, dir: &str) {
        if let Err(e) = self.state.open(dir).and_then(|d| d.sync_all()) {
            tracing::warn!("syncing the state directory {dir}: {e}");
        }
    }

    /// Removes compiled code of `sha256` for `tenant` unless another of its functions uses it.
    fn forget_code(&self, runtime: &Runtime, tenant: &str, sha256: &str, table: &Table) {
        let used = table
            .get(tenant)
            .is_some_and(|f| f.values().any(|f| f.sha256 == sha256));
        if !used {
            let _ = self
                .state
                .remove_file(Self::code_file(runtime, tenant, sha256));
        }
    }

    /// Removes what no loaded function can use from the state directory: compiled code of
    /// other engine versions, of functions no longer there and of tenants the policy no longer
    /// has, and files a crash left half written (`*.tmp`). The uploads of a tenant the policy no
    /// longer has are kept (they come back if the tenant is added again) and logged with their
    /// size. Run at start, before any upload: a compile in progress writes code that is not in
    /// the table yet.
    pub fn sweep(&self, runtime: &Runtime) {
        let tenants = lock(&self.writers);
        let table = read(&self.table);
        let (mut files, mut bytes) = (0usize, 0u64);
        let mut count = |(n, b): (usize, u64)| {
            files += n;
            bytes += b;
        };
        for (tenant, fns) in table.iter() {
            count(self.remove_files(&format!("functions/{tenant}"), |f| f.ends_with(".tmp")));
            // A tenant without the deploy right keeps the code of its uploads, which are not
            // loaded: they come back with the right, without compiling again.
            if tenants.get(tenant).is_some_and(|t| !t.deploy) {
                continue;
            }
            let keep: HashSet<String> = fns
                .values()
                .map(|f| Self::cache_name(runtime, &f.sha256))
                .collect();
            count(self.remove_files(&format!("compiled/{tenant}"), |f| !keep.contains(f)));
        }
        let gone = |dir: &str| -> Vec<String> {
            let Ok(entries) = self.state.read_dir(dir) else {
                return Vec::new();
            };
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|t| valid_name(t) && !tenants.contains_key(t))
                .collect()
        };
        for tenant in gone("compiled") {
            let dir = format!("compiled/{tenant}");
            count(self.remove_files(&dir, |_| true));
            let _ = self.state.remove_dir(&dir);
        }
        if files > 0 {
            tracing::info!(
                "removed {files} unused file(s) ({bytes} bytes) from the state directory: compiled code no function uses, half-written files"
            );
        }
        for tenant in gone("functions") {
            let dir = format!("functions/{tenant}");
            let (mut n, mut b) = (0usize, 0u64);
            for e in self.state.read_dir(&dir).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().ends_with(".wasm") {
                    n += 1;
                    b += e.metadata().map_or(0, |m| m.len());
                }
            }
            tracing::info!(
                "tenant `{tenant}` is not in the policy: its {n} uploaded function(s) ({b} bytes) stay under {dir} in the state directory, and are loaded again if the tenant is added back; remove the directory to free them"
            );
        }
    }

    /// Removes the files of `dir` (in the state directory) whose names are `unused`; returns how
    /// many and their bytes.
    fn remove_files(&self, dir: &str, unused: impl Fn(&str) -> bool) -> (usize, u64) {
        let (mut files, mut bytes) = (0, 0);
        let Ok(entries) = self.state.read_dir(dir) else {
            return (0, 0);
        };
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if !entry.file_type().is_ok_and(|t| t.is_file()) || !unused(&file) {
                continue;
            }
            let size = entry.metadata().map_or(0, |m| m.len());
            match self.state.remove_file(format!("{dir}/{file}")) {
                Ok(()) => {
                    files += 1;
                    bytes += size;
                }
                Err(e) => tracing::warn!("not removing {dir}/{file}: {e}"),
            }
        }
        (files, bytes)
    }

    /// (Re)loads every tenant's functions: those it uploaded earlier (kept under the state
    /// directory; one that no longer builds is skipped with a warning; none while the tenant
    /// has no deploy right, their files and compiled code kept), then those the policy
    /// names (an error: the operator must fix the policy). If it fails, deploys and removals
    /// are held to `fallback` from then on (the tenants the host serves instead: the old
    /// policy less what the new one revokes), before any waiting for the reload goes on: they
    /// had stayed the old ones, so a tenant whose token the reload changed had its uploads
    /// refused once compiled (401) and could remove nothing, and a deploy waiting for the
    /// reload with the old token went through.
    pub fn load_all(
        &self,
        runtime: &Runtime,
        policy: &Policy,
        fallback: &BTreeMap<String, Arc<Tenant>>,
    ) -> anyhow::Result<()> {
        let mut writers = lock(&self.writers);
        let loaded = self.load_table(runtime, policy, &writers);
        match loaded {
            Ok(()) => writers.clone_from(&policy.tenants),
            Err(_) => writers.clone_from(fallback),
        }
        loaded
    }

    /// [`Self::load_all`]'s work, under `writers` (the tenants as they were).
    fn load_table(
        &self,
        runtime: &Runtime,
        policy: &Policy,
        writers: &BTreeMap<String, Arc<Tenant>>,
    ) -> anyhow::Result<()> {
        let mut table = Table::new();
        // Each function the table has, of the same bytes, kind and capabilities, is kept as it
        // is: see [`Self::unchanged`].
        let build = |tenant: &Tenant,
                     name: &str,
                     bytes: &[u8],
                     managed: bool,
                     fns: &BTreeMap<String, Arc<Function>>| {
            match self.unchanged(writers.get(&tenant.name), tenant, name, bytes, managed) {
                Some(f) => Ok(f),
                None => self
                    .build(runtime, tenant, name, bytes, managed, fns)
                    .map(Arc::new),
            }
        };
        for tenant in policy.tenants.values() {
            let mut fns = BTreeMap::new();
            let dir = format!("functions/{}", tenant.name);
            // A tenant without the deploy right runs none of its uploads (an operator takes
            // the right away to stop them): they stay on disk and come back with the right.
            let uploads = match tenant.deploy {
                true => self.state.read_dir(&dir).ok(),
                false => None,
            };
            if let Some(entries) = uploads {
                for entry in entries.flatten() {
                    let file = entry.file_name().to_string_lossy().into_owned();
                    let Some(name) = file.strip_suffix(".wasm").filter(|n| valid_name(n)) else {
                        continue;
                    };
                    if tenant.functions.contains_key(name) {
                        continue;
                    }
                    let built = self
                        .state
                        .read(format!("{dir}/{file}"))
                        .map_err(|e| FunctionError::Host(e.to_string()))
                        .and_then(|bytes| build(tenant, name, &bytes, false, &fns));
                    match built {
                        Ok(f) => {
                            fns.insert(name.to_string(), f);
                        }
                        Err(e) => tracing::warn!(
                            "tenant `{}`: not loading uploaded function `{name}`: {e}",
                            tenant.name
                        ),
                    }
                }
            }
            for (name, path) in &tenant.functions {
                let bytes = std::fs::read(path).map_err(|e| {
                    anyhow::anyhow!(
                        "tenant `{}` function `{name}`: reading {}: {e}",
                        tenant.name,
                        path.display()
                    )
                })?;
                let f = build(tenant, name, &bytes, true, &fns).map_err(|e| {
                    anyhow::anyhow!(
                        "tenant `{}` function `{name}` ({}): {e}",
                        tenant.name,
                        path.display()
                    )
                })?;
                fns.insert(name.clone(), f);
            }
            let (count, wasm, compiled) =
                footprint(fns.values().map(Arc::as_ref), std::iter::empty(), None);
            let limits = &tenant.limits;
            if count > limits.max_functions || wasm + compiled > limits.max_function_bytes {
                tracing::warn!(
                    "tenant `{}`: its {count} uploaded functions take {} bytes ({wasm} of Wasm and {compiled} of compiled code), over its quota ({} functions, {} bytes): they keep running, and its uploads are refused until some are removed or the quota is raised",
                    tenant.name,
                    wasm + compiled,
                    limits.max_functions,
                    limits.max_function_bytes
                );
            }
            table.insert(tenant.name.clone(), fns);
        }
        // Uploads the new table does not keep as they were (replaced on disk, their tenant's
        // capabilities changed, their tenant removed) are retired like a replaced upload:
        // calls running on them hold their code, which counts against the quota until they
        // end. Without this a reload took that code out of every count.
        let gone: Vec<(String, Arc<Function>)> = {
            let old = read(&self.table);
            old.iter()
                .flat_map(|(tenant, fns)| fns.values().map(move |f| (tenant, f)))
                .filter(|(tenant, f)| {
                    !table
                        .get(*tenant)
                        .and_then(|now| now.get(&f.name))
                        .is_some_and(|now| Arc::ptr_eq(now, f))
                })
                .map(|(tenant, f)| (tenant.clone(), Arc::clone(f)))
                .collect()
        };
        *write(&self.table) = table;
        for (tenant, f) in &gone {
            self.retire(tenant, f);
        }
        Ok(())
    }

    /// The function `name` of `tenant` in the table now, if a reload may keep it as it is: the
    /// same bytes, deployed the same way (by the policy or uploaded), and the tenant's
    /// capabilities, linked into it, as they were (`was`). Keeping it keeps its identity:
    /// calls running on it hold it, and a later replacement retires it, counted in the quota
    /// while they run; a reload had put a new copy of every function in the table, and the
    /// one calls held was counted by nobody. It also spares checking every upload again.
    fn unchanged(
        &self,
        was: Option<&Arc<Tenant>>,
        tenant: &Tenant,
        name: &str,
        bytes: &[u8],
        managed: bool,
    ) -> Option<Arc<Function>> {
        let was = was.filter(|w| w.capabilities == tenant.capabilities)?;
        let f = self.get(&was.name, name)?;
        (f.managed == managed && f.size == bytes.len() && f.sha256 == hash_bytes(bytes))
            .then_some(f)
    }

    /// Reserves the tenant's one upload in progress for function `name`, before its bytes are
    /// read: checks the name, that the policy does not manage it, the quota at the upload's
    /// `declared` size (0 when unknown), and that the tenant has no other upload in progress.
    pub fn reserve(
        &self,
        tenant: &Tenant,
        name: &str,
        declared: u64,
    ) -> Result<Reservation, FunctionError> {
        if !valid_name(name) {
            return Err(FunctionError::BadName(quote(name)));
        }
        let previous = self.get(&tenant.name, name);
        if previous.as_ref().is_some_and(|f| f.managed) || tenant.functions.contains_key(name) {
            return Err(FunctionError::Managed(name.to_string()));
        }
        self.check_quota(tenant, name, declared, None)?;
        let mut q = lock(&self.queue);
        // A full queue refuses the upload before its bytes are read (up to the tenant's
        // `max_function_bytes` each), not once they are all in: every deploy-capable tenant's
        // upload was read whole only to be refused.
        q.has_room()?;
        let owed = q.owed(tenant, Instant::now());
        let burst = tenant.limits.compile_burst.as_secs_f64();
        if owed >= burst {
            let share = tenant.limits.compile_share;
            let wait = (owed - burst) / (f64::from(share) / 100.0);
            return Err(FunctionError::Busy(format!(
                "tenant `{}` has used its compile time: {owed:.2} s of compiling not yet paid back at {share}% of one compile thread, past its burst of {burst:.2} s; retry in {wait:.1} s",
                tenant.name
            )));
        }
        if !q.tenants.insert(tenant.name.clone()) {
            return Err(FunctionError::Busy(format!(
                "tenant `{}` has an upload in progress; retry when it is done",
                tenant.name
            )));
        }
        Ok(Reservation {
            queue: Arc::clone(&self.queue),
            tenant: tenant.name.clone(),
            name: name.to_string(),
        })
    }

    /// Deploys a reserved upload: checks the quota and the bytes, waits its turn in the
    /// compile queue, compiles, stores and replaces any earlier function of that name. An
    /// upload refused before the compiler takes it is counted in `metrics` as refused; one it
    /// takes, under its outcome with the time it took, even when its client has gone.
    pub async fn deploy(
        self: &Arc<Self>,
        runtime: &Arc<Runtime>,
        tenant: &Arc<Tenant>,
        reservation: Reservation,
        bytes: bytes::Bytes,
        metrics: &Arc<Metrics>,
    ) -> Result<Arc<Function>, FunctionError> {
        let name = reservation.name.clone();
        let refused = |e: FunctionError| {
            metrics.refused(&tenant.name, "deploy", e.code().as_str());
            e
        };
        // At its real size (the reservation checked the declared one). The tenant has no other
        // upload in progress, so nothing else adds to its functions until this one is done.
        self.check_quota(tenant, &name, bytes.len() as u64, None)
            .map_err(refused)?;
        let queued = self.enqueue().map_err(refused)?;
        let turn = Arc::clone(&self.compiler)
            .acquire_owned()
            .await
            .map_err(|_| FunctionError::Host("the compiler stopped".into()))?;
        let (me, rt, t, n, m) = (
            Arc::clone(self),
            Arc::clone(runtime),
            Arc::clone(tenant),
            name,
            Arc::clone(metrics),
        );
        // The compile cannot be stopped once it runs; it keeps its place and turn until it ends,
        // whether or not anyone still waits for it.
        tokio::task::spawn_blocking(move || {
            let _held = (reservation, queued, turn);
            let started = Instant::now();
            let built = me.build(&rt, &t, &n, &bytes, false, &BTreeMap::new());
            let built_in = started.elapsed();
            // The commit's work (its writes and syncs) is the tenant's too, as it holds its
            // compile turn through it; its wait for the writers' lock (behind a reload, or
            // another tenant's commit) is not.
            let (deployed, committing) = match built {
                Ok(f) => me.commit(&rt, &t, &n, &bytes, f),
                Err(e) => (Err(e), Duration::ZERO),
            };
            let spent = started.elapsed();
            lock(&me.queue).charge(&t, built_in + committing);
            m.uploaded(
                &t.name,
                deployed
                    .as_ref()
                    .map_or_else(|e| e.code().as_str(), |_| "ok"),
                spent,
            );
            deployed
        })
        .await
        .map_err(|e| FunctionError::Host(format!("compile worker: {e}")))?
    }

    /// Saves a compiled upload and enters it in the table, under the policy in force now (`t`
    /// is the tenant as the upload found it): a reload while it compiled may have removed the
    /// tenant, taken its right to deploy, made the name the operator's or lowered its quota
    /// (the upload is refused, and the compiled code its build kept is removed), or changed its
    /// capabilities (the code is checked and prepared again for them, from that code).
    fn commit(
        &self,
        runtime: &Runtime,
        t: &Tenant,
        name: &str,
        bytes: &[u8],
        built: Function,
    ) -> (Result<Arc<Function>, FunctionError>, Duration) {
        let writers = lock(&self.writers);
        let held = Instant::now();
        let sha256 = built.sha256.clone();
        let entered = self.enter(runtime, &writers, t, name, bytes, built);
        if entered.is_err() {
            // The compiled code the build kept, unless a function of the tenant uses it.
            let table = read(&self.table);
            self.forget_code(runtime, &t.name, &sha256, &table);
        }
        (entered, held.elapsed())
    }

    /// [`Self::commit`]'s checks and writes, under `writers`.
    fn enter(
        &self,
        runtime: &Runtime,
        writers: &BTreeMap<String, Arc<Tenant>>,
        t: &Tenant,
        name: &str,
        bytes: &[u8],
        built: Function,
    ) -> Result<Arc<Function>, FunctionError> {
        let Some(now) = t.as_in(writers) else {
            return Err(revoked(&t.name, name, "deployed"));
        };
        if !now.deploy {
            return Err(FunctionError::NotAllowed(format!(
                "the policy was reloaded while function `{name}` compiled, and tenant `{}` may no longer deploy functions: nothing was deployed",
                t.name
            )));
        }
        if now.functions.contains_key(name) {
            return Err(FunctionError::Managed(name.to_string()));
        }
        self.check_quota(
            now,
            name,
            bytes.len() as u64,
            Some((&built.sha256, built.code_size)),
        )?;
        // The same bytes again under the same name: the function stands as it is, nothing is
        // written (a loop of such uploads rewrote and synced the file each time, holding the
        // writers' lock that every commit, removal and reload waits for).
        let dir = format!("functions/{}", t.name);
        let file = format!("{dir}/{name}.wasm");
        let current = read(&self.table)
            .get(&t.name)
            .and_then(|fns| fns.get(name))
            .cloned();
        if let Some(current) = current
            && current.sha256 == built.sha256
            && self
                .state
                .metadata(&file)
                .is_ok_and(|m| m.len() == bytes.len() as u64)
        {
            // Its compiled code kept again if it went (a failed write, a full disk).
            let cached = Self::code_file(runtime, &t.name, &current.sha256);
            if !self.state.exists(&cached) {
                self.keep_code(&t.name, name, &cached, current.prepared.component());
            }
            return Ok(current);
        }
        let f = Arc::new(if now.capabilities == t.capabilities {
            built
        } else {
            self.build(runtime, now, name, bytes, false, &BTreeMap::new())?
        });
        self.write(&dir, &file, bytes)
            .map_err(|e| FunctionError::Host(format!("saving function `{name}`: {e}")))?;
        // A build that shared the compiled code of a loaded function wrote no file of it; a
        // removal of that function since (removals wait for this lock, builds do not) took the
        // file away, and the host would compile the code again at every start.
        let cached = Self::code_file(runtime, &t.name, &f.sha256);
        if !self.state.exists(&cached) {
            self.keep_code(&t.name, name, &cached, f.prepared.component());
        }
        let old = write(&self.table)
            .entry(t.name.clone())
            .or_default()
            .insert(name.to_string(), Arc::clone(&f));
        if let Some(old) = old.filter(|o| o.sha256 != f.sha256) {
            // Its file unlinked under the read lock: invocations read on meanwhile.
            let table = read(&self.table);
            self.forget_code(runtime, &t.name, &old.sha256, &table);
            drop(table);
            self.retire(&t.name, &old);
        }
        Ok(f)
    }

    /// Checks that the tenant's uploaded functions stay within its quota with `name` at `size`
    /// bytes of Wasm and, once it is compiled, `code` (its digest and compiled bytes, counted
    /// once for functions with the same bytes).
    fn check_quota(
        &self,
        tenant: &Tenant,
        name: &str,
        size: u64,
        code: Option<(&str, u64)>,
    ) -> Result<(), FunctionError> {
        let fns = self.list(&tenant.name);
        // The others it keeps: one it replaces by name is not counted.
        let others = fns.iter().map(Arc::as_ref).filter(|f| f.name != name);
        let held = self.still_running(&tenant.name);
        let (count, wasm, compiled) = footprint(others, held.iter().map(Arc::as_ref), code);
        let limits = &tenant.limits;
        if count + 1 > limits.max_functions {
            return Err(FunctionError::Quota(format!(
                "tenant `{}` may keep {} uploaded functions and has {count}; remove one first",
                tenant.name, limits.max_functions,
            )));
        }
        let wasm = wasm + size;
        let bytes = wasm + compiled;
        if bytes > limits.max_function_bytes {
            return Err(FunctionError::Quota(format!(
                "tenant `{}`'s uploaded functions would take {bytes} bytes ({wasm} of Wasm and \
                 {compiled} of compiled code{}{}); its quota is {}",
                tenant.name,
                if code.is_none() {
                    ", before this one is compiled"
                } else {
                    ""
                },
                if held.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", the code of {} replaced or removed uploads included, which calls \
                         still run on",
                        held.len()
                    )
                },
                limits.max_function_bytes
            )));
        }
        Ok(())
    }

    /// The tenant's uploads out of the table that calls still run on.
    fn still_running(&self, tenant: &str) -> Vec<Arc<Function>> {
        let mut retired = lock(&self.retired);
        let Some(list) = retired.get_mut(tenant) else {
            return Vec::new();
        };
        list.retain(|w| w.strong_count() > 0);
        let alive = list.iter().filter_map(Weak::upgrade).collect();
        if list.is_empty() {
            retired.remove(tenant);
        }
        alive
    }

    /// Keeps track of `f`, out of the table, while calls still run on it.
    fn retire(&self, tenant: &str, f: &Arc<Function>) {
        if f.managed {
            return;
        }
        let mut retired = lock(&self.retired);
        let list = retired.entry(tenant.to_string()).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(f));
    }

    /// A place in the compile queue (waiting for the compiler or being compiled),
    /// [`MAX_COMPILE_QUEUE`] in all.
    fn enqueue(&self) -> Result<Queued, FunctionError> {
        let mut q = lock(&self.queue);
        q.has_room()?;
        q.waiting += 1;
        Ok(Queued {
            queue: Arc::clone(&self.queue),
        })
    }

    /// Removes an uploaded function, its file and (if no other function uses it) its code.
    pub fn undeploy(
        &self,
        runtime: &Runtime,
        tenant: &Tenant,
        name: &str,
    ) -> Result<(), FunctionError> {
        if !valid_name(name) {
            return Err(FunctionError::BadName(quote(name)));
        }
        // After a reload in progress, which may have read the function from the state
        // directory already, and under the tenant as it left it.
        let writers = lock(&self.writers);
        if tenant.as_in(&writers).is_none() {
            return Err(revoked(&tenant.name, name, "removed"));
        }
        let not_found = || FunctionError::NotFound {
            tenant: tenant.name.clone(),
            name: name.to_string(),
        };
        match self.get(&tenant.name, name) {
            None => return Err(not_found()),
            Some(f) if f.managed => return Err(FunctionError::Managed(name.to_string())),
            Some(_) => {}
        }
        // Its file gone, or it stays: a file left behind would bring the function back at the
        // next reload or start, after the client was told it was removed. Removed and synced
        // before the table is locked for writing (`writers`, held, orders every change): every
        // invocation reads the table, and the directory's fsync took milliseconds each time, so
        // a tenant removing and uploading one function in a loop stalled every tenant's calls.
        match self
            .state
            .remove_file(format!("functions/{}/{name}.wasm", tenant.name))
        {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(FunctionError::Host(format!(
                    "removing function `{name}` of tenant `{}`: {e}; it stays deployed",
                    tenant.name
                )));
            }
            _ => self.sync_dir(&format!("functions/{}", tenant.name)),
        }
        let removed = write(&self.table)
            .get_mut(&tenant.name)
            .and_then(|fns| fns.remove(name));
        let Some(f) = removed else {
            return Ok(());
        };
        let table = read(&self.table);
        self.forget_code(runtime, &tenant.name, &f.sha256, &table);
        drop(table);
        self.retire(&tenant.name, &f);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// An upload is refused at once while the compile queue is full, before its bytes are
    /// read: it was refused only once they were all in.
    #[test]
    fn a_full_queue_refuses_an_upload_before_its_bytes_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let functions = Functions::open(dir.path()).expect("state directory");
        let tenant = |name: &str| Tenant {
            name: name.into(),
            token_sha256: [0; 32],
            grants: Vec::new(),
            models: BTreeSet::new(),
            private_models: Vec::new(),
            limits: crate::policy::Limits::default(),
            deploy: true,
            capabilities: crate::policy::Capabilities::default(),
            functions: BTreeMap::new(),
        };
        let full: Vec<Queued> = (0..MAX_COMPILE_QUEUE)
            .map(|_| functions.enqueue().expect("room"))
            .collect();
        let refused = functions.reserve(&tenant("late"), "f", 1 << 20);
        assert!(
            matches!(&refused, Err(FunctionError::Busy(m)) if m.contains("waiting to be compiled")),
            "{refused:?}"
        );
        // Refused, it holds no upload in progress for its tenant.
        drop(full);
        let reserved = functions.reserve(&tenant("late"), "f", 1 << 20);
        assert!(reserved.is_ok(), "{reserved:?}");
    }
}
