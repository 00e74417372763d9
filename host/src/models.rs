//! The model packages this host serves, and per-model measurements made once and kept: the
//! memory model ([`crate::memory`]) and the per-layer profile.
//!
//! **The catalog.** Packages come from the policy's `host.models` directories (shared: a tenant
//! may use those its `models` names) and from each tenant's `private_models` directories
//! (that tenant's alone: listed, described and loadable by it only). A tenant names a model by
//! its manifest name; names are scoped per tenant, so two tenants may each have a private
//! `mynet`. Inside the host a model is known by its id: the name for a shared package,
//! `<tenant>/<name>` for a private one (manifest names cannot hold `/`), which is what the device
//! loads, charges and reports. A policy reload reads the directories again: packages appear and
//! disappear; one whose files changed keeps serving as first read until a restart (the device
//! may hold it loaded), and the reload says so. An id a reload removed that comes back with
//! another package is not served until a restart, and the reload says so too: the device may
//! still hold the first package's weights under the id, with its profiles.
//!
//! **Measured before serving.** The memory model of every package some tenant may use is made
//! when the host starts (or when a reload adds it), with progress in the log, so that no
//! tenant's first call waits for it. It is kept on disk (`<state>/memory/`), keyed by the
//! package's manifest, its layer files' sizes and modification times, and the device (a
//! package whose layers changed under the same manifest is measured again: its memory model,
//! which every tenant of the model is charged by, was kept from the old files), and shared
//! within the process: a restarted host, or a second host in the same process, plans with the
//! same model instead of measuring again.
//! A failed measurement (memory model or profile) is not kept: calls in the next
//! [`FAILURE_KEPT`] get its error, the first call after it measures again.

use crate::account::text::panic_message;
use crate::locks::{lock, read, write};
use crate::memory;
use crate::policy::packages::{Found, PolicyModels};
use crate::policy::{Policy, Tenant};
use hapi_model::profile::profile_layers_while;
use hapi_model::{Manifest, ModelPackage};
use hapi_wire::profile::{LayerProfile, ModelMemory};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock, TryLockError};
use std::time::{Duration, Instant};
use tch::Device;

/// Batch size of the profile endpoint's measurements, where the device budget holds it.
pub const PROFILE_BATCH: i64 = 8;
/// Timed repetitions per layer (median reported).
pub const PROFILE_REPS: usize = 3;

type Slot<T> = Arc<Memo<T>>;

/// How long a failed measurement is answered from memory before a call measures again.
pub const FAILURE_KEPT: Duration = Duration::from_secs(60);
/// How long a profile measured at a smaller batch than the budget can hold (not kept for every
/// tenant) is answered to the tenant that measured it before it measures again.
pub const UNKEPT_FOR: Duration = Duration::from_secs(60);

/// Profiles answered to one tenant only, by (model id, tenant): when each was measured.
type Unkept = HashMap<(String, String), (Instant, Arc<Vec<LayerProfile>>)>;

/// A measurement made once and kept. Callers that arrive while it runs wait for it (they run
/// on blocking threads); [`Memo::done`] and [`Memo::failed`] never wait. A failure is kept only
/// for a while ([`FAILURE_KEPT`]): one that passes (the device out of memory while other
/// tenants' batches ran, a file being replaced) is measured again by a later call instead of
/// failing every use until the host restarts, and one that lasts (a package that cannot run)
/// is not measured again on every call that names it.
#[derive(Debug)]
pub(crate) struct Memo<T> {
    value: OnceLock<Arc<T>>,
    /// Held while the value is made; the last failure and when it happened.
    failure: Mutex<Option<(String, Instant)>>,
    failure_kept: Duration,
}

impl<T> Default for Memo<T> {
    fn default() -> Self {
        Self::keeping_failures(FAILURE_KEPT)
    }
}

impl<T> Memo<T> {
    pub(crate) fn keeping_failures(failure_kept: Duration) -> Self {
        Self {
            value: OnceLock::new(),
            failure: Mutex::new(None),
            failure_kept,
        }
    }

    /// The value, if it was made.
    pub(crate) fn done(&self) -> Option<Arc<T>> {
        self.value.get().cloned()
    }

    /// The kept failure's error, when the last attempt failed less than the period ago and
    /// no attempt runs now.
    pub(crate) fn failed(&self) -> Option<String> {
        let failure = match self.failure.try_lock() {
            Ok(f) => f,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        self.kept(failure.as_ref())
    }

    fn kept(&self, failure: Option<&(String, Instant)>) -> Option<String> {
        let (error, at) = failure?;
        (at.elapsed() < self.failure_kept).then(|| {
            format!(
                "{error} (failed {:.0} s ago; tried again {:.0} s after a failure)",
                at.elapsed().as_secs_f64(),
                self.failure_kept.as_secs_f64()
            )
        })
    }

    /// The value, made by `make` unless it was made before or failed less than the period ago
    /// (that failure's error then, with its age). Blocks while another caller makes it.
    pub(crate) fn get_or_make(
        &self,
        make: impl FnOnce() -> Result<Arc<T>, String>,
    ) -> Result<Arc<T>, String> {
        self.get_or_try(|| make().map(Some))
            .and_then(|made| made.ok_or_else(|| "not made".to_string()))
    }

    /// [`Self::get_or_make`] where `make` may stop short (`Ok(None)`, its caller's time is up):
    /// nothing is kept then, neither value nor failure, and the next caller makes it.
    pub(crate) fn get_or_try(
        &self,
        make: impl FnOnce() -> Result<Option<Arc<T>>, String>,
    ) -> Result<Option<Arc<T>>, String> {
        if let Some(v) = self.done() {
            return Ok(Some(v));
        }
        let mut failure = lock(&self.failure);
        // Made while this caller waited.
        if let Some(v) = self.done() {
            return Ok(Some(v));
        }
        if let Some(e) = self.kept(failure.as_ref()) {
            return Err(e);
        }
        // A panic (libtorch's errors in tch's panicking calls, out of memory among them) is a
        // failure like any other: kept, not lost with the lock poisoned.
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
            .unwrap_or_else(|p| Err(format!("panicked: {}", panic_message(p.as_ref()))));
        match &made {
            Ok(Some(v)) => {
                let _ = self.value.set(Arc::clone(v));
                *failure = None;
            }
            Ok(None) => {}
            Err(e) => *failure = Some((e.clone(), Instant::now())),
        }
        made
    }
}

/// Bumped when the measurement changes, so that kept models of an older one are not used.
const MEMORY_MODEL_VERSION: u32 = 1;

#[derive(Debug, Clone)]
struct Entry {
    found: Found,
    /// What identifies the memory model: the package's manifest, the device (a CPU's with
    /// libtorch's threads per operator), the measurement.
    memory_key: String,
}

/// Packages by id (`name`, or `tenant/name` for a private one).
#[derive(Debug, Default)]
struct Catalog {
    entries: BTreeMap<String, Entry>,
    /// Ids that a reload removed since the host started, each with the fingerprint of the
    /// package it had: the device may still hold that package's weights, and profiles of it
    /// are kept, under the id. An id that comes back with another package is not served until
    /// a restart (a tenant added again under a removed one's name would otherwise have been
    /// served the removed tenant's private weights and profile under its own model's name).
    retired: BTreeMap<String, String>,
}

/// The id of tenant `tenant`'s private model `name`.
pub fn private_id(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

#[derive(Debug)]
pub struct Models {
    device: Device,
    catalog: RwLock<Arc<Catalog>>,
    profiles: Mutex<HashMap<String, Slot<Vec<LayerProfile>>>>,
    /// Profiles measured at a smaller batch, each answered to its tenant for [`UNKEPT_FOR`]:
    /// without them a tenant that kept its room small (its own work holding the budget) made
    /// every profile call measure the whole model again, each one waiting on the model's turn
    /// before the next tenant's.
    unkept: Mutex<Unkept>,
    /// Measurements stopped at their tenant's time limit, by (model id, tenant): when, and
    /// the limit. For [`UNKEPT_FOR`] the tenant's profile calls of that model, under the same
    /// limit or a shorter one, are answered that, not measured again: a tenant whose limit is
    /// shorter than a model's measurement could otherwise start one after another, each
    /// running to its limit outside the fair schedule, holding device memory and the model's
    /// turn.
    stopped: Mutex<HashMap<(String, String), (Instant, Duration)>>,
    /// Where memory models are kept across restarts.
    kept: Option<PathBuf>,
}

/// Memory models of this process, by key: hosts in one process (tests, benches) measure a
/// model once between them, the others waiting for it.
fn measured(key: &str) -> Slot<ModelMemory> {
    static M: OnceLock<Mutex<HashMap<String, Slot<ModelMemory>>>> = OnceLock::new();
    Models::slot(M.get_or_init(Mutex::default), key)
}

/// A model as a tenant sees it: its id on this host and its manifest.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub id: String,
    pub manifest: Arc<Manifest>,
}

impl Models {
    /// The catalog of `policy`'s packages (see the module's doc). Memory models are kept under
    /// `kept` (created if need be).
    pub fn open(policy: &Policy, device: Device, kept: Option<PathBuf>) -> anyhow::Result<Self> {
        let found = PolicyModels::read(policy).map_err(anyhow::Error::msg)?;
        if let Some(k) = &kept {
            std::fs::create_dir_all(k)?;
        }
        let models = Self {
            device,
            catalog: RwLock::default(),
            profiles: Mutex::default(),
            unkept: Mutex::default(),
            stopped: Mutex::default(),
            kept,
        };
        *write(&models.catalog) = Arc::new(models.catalog_of(&found, None).0);
        Ok(models)
    }

    fn catalog_of(&self, found: &PolicyModels, old: Option<&Catalog>) -> (Catalog, Vec<String>) {
        let device = self.device;
        // A CPU's times depend on libtorch's threads per operator (`share_cores`).
        let threads = match device {
            Device::Cpu => format!("-t{}", tch::get_num_threads()),
            _ => String::new(),
        };
        let mut changed = Vec::new();
        let mut entries = BTreeMap::new();
        // A private package's memory model is its tenant's: keyed by the manifest alone, a
        // tenant's package with another's manifest (a shared model's, byte for byte, and other
        // layers) would have set, or taken, the memory model every tenant of that model is
        // charged by, kept across restarts.
        let ids = found
            .shared
            .iter()
            .map(|(name, f)| (name.clone(), String::new(), f))
            .chain(found.private.iter().flat_map(|(tenant, mine)| {
                mine.iter()
                    .map(move |(name, f)| (private_id(tenant, name), format!("{tenant}-"), f))
            }));
        let mut retired = old.map(|c| c.retired.clone()).unwrap_or_default();
        for (id, owner, f) in ids {
            if let Some(was) = retired.get(&id) {
                if *was != f.fingerprint {
                    changed.push(format!(
                        "model package `{id}` (removed by an earlier reload and back with \
                         another package: not served until a restart)"
                    ));
                    continue;
                }
                retired.remove(&id);
            }
            let mut entry = Entry {
                memory_key: format!(
                    "{}-{}-{owner}{device:?}{threads}-v{MEMORY_MODEL_VERSION}",
                    f.manifest.name,
                    &f.fingerprint[..16]
                ),
                found: f.clone(),
            };
            if let Some(before) = old.and_then(|c| c.entries.get(&id))
                && before.found.fingerprint != f.fingerprint
            {
                // The device may hold the package as first read; serving the new files under
                // the same id would mix the two.
                changed.push(format!("model package `{id}` (its files changed)"));
                entry = before.clone();
            }
            entries.insert(id, entry);
        }
        for (id, e) in old.map(|c| &c.entries).into_iter().flatten() {
            if !entries.contains_key(id) && !retired.contains_key(id) {
                retired.insert(id.clone(), e.found.fingerprint.clone());
            }
        }
        (Catalog { entries, retired }, changed)
    }

    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&read(&self.catalog))
    }

    /// Reads the packages of `policy` again. Returns what takes a restart, one line each:
    /// packages whose files changed (they keep serving as first read until then), and ids that
    /// a reload had removed and that come back with another package (not served until then).
    pub fn reload(&self, found: &PolicyModels) -> Vec<String> {
        let old = self.catalog();
        let (catalog, changed) = self.catalog_of(found, Some(&old));
        *write(&self.catalog) = Arc::new(catalog);
        changed
    }

    /// The ids of the models some tenant of `policy` may use.
    pub fn usable(&self, policy: &Policy) -> Vec<String> {
        let catalog = self.catalog();
        // In id order: the catalog is a BTreeMap.
        catalog
            .entries
            .keys()
            .filter(|id| match id.split_once('/') {
                Some((tenant, _)) => policy.tenants.contains_key(tenant),
                None => policy.tenants.values().any(|t| t.models.contains(*id)),
            })
            .cloned()
            .collect()
    }

    /// Makes the memory model of every model in `ids` that is neither in this process nor kept
    /// on disk, logging progress. A model that fails to load or measure is logged (the others
    /// still get measured) and tried again at its first use (a failed measurement answers with
    /// its error for [`FAILURE_KEPT`] first).
    pub fn measure_ahead(&self, ids: &[String]) {
        let catalog = self.catalog();
        let mut todo = Vec::new();
        for id in ids {
            let Some(e) = catalog.entries.get(id) else {
                continue;
            };
            if self.kept_model(e).is_some() {
                continue;
            }
            match measured(&e.memory_key).done() {
                // Measured by another host of this process: kept here too.
                Some(m) => self.keep(e, &m),
                None => todo.push(id),
            }
        }
        if todo.is_empty() {
            return;
        }
        let started = Instant::now();
        tracing::info!(
            "measuring the memory model of {} model(s) on {:?} before serving ({} already kept)",
            todo.len(),
            self.device,
            ids.len() - todo.len()
        );
        for (i, id) in todo.iter().enumerate() {
            tracing::info!(
                "memory model {}/{}: `{id}`: loading and measuring",
                i + 1,
                todo.len()
            );
            match self.load(id).and_then(|pkg| self.memory(id, &pkg)) {
                // Another host of this process may have been measuring it: keep it here too.
                Ok(m) => {
                    if let Some(e) = catalog.entries.get(*id)
                        && self.kept_model(e).is_none()
                    {
                        self.keep(e, &m);
                    }
                }
                Err(e) => tracing::error!("memory model {}/{}: `{id}`: {e}", i + 1, todo.len()),
            }
        }
        tracing::info!(
            "memory models ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }

    /// Model `name` as `tenant` may use it: its private package of that name, else a shared one
    /// it is granted. `None` for a model it may not use, whether or not it exists.
    pub fn resolve(&self, tenant: &Tenant, name: &str) -> Option<Resolved> {
        // A name with `/` could only be another tenant's id.
        if name.contains('/') {
            return None;
        }
        let catalog = self.catalog();
        // Longer than every id, it is none of them: refused before it is copied into the
        // private id (a guest's name may be as long as its memory, which the host already
        // holds one copy of, lifted for the call).
        if catalog.entries.keys().all(|id| id.len() < name.len()) {
            return None;
        }
        let private = private_id(&tenant.name, name);
        let id = if catalog.entries.contains_key(&private) {
            private
        } else if tenant.models.contains(name) && catalog.entries.contains_key(name) {
            name.to_string()
        } else {
            return None;
        };
        let manifest = Arc::clone(&catalog.entries[&id].found.manifest);
        Some(Resolved { id, manifest })
    }

    /// Whether `tenant` may use the model with id `id` (what [`Models::resolve`] gave), under
    /// the grants it has now: its own packages, or a shared model it is granted.
    pub fn may_use(&self, tenant: &Tenant, id: &str) -> bool {
        let granted = match id.split_once('/') {
            Some((owner, _)) => owner == tenant.name,
            None => tenant.models.contains(id),
        };
        granted && self.catalog().entries.contains_key(id)
    }

    /// Every model `tenant` may use, by the name it uses.
    pub fn visible(&self, tenant: &Tenant) -> Vec<(String, Arc<Manifest>)> {
        let catalog = self.catalog();
        let mut names: Vec<String> = tenant.models.iter().cloned().collect();
        let prefix = private_id(&tenant.name, "");
        names.extend(
            catalog
                .entries
                .keys()
                .filter_map(|id| id.strip_prefix(&prefix).map(str::to_string)),
        );
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|n| self.resolve(tenant, &n).map(|r| (n, r.manifest)))
            .collect()
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The manifest of model `id`.
    pub fn manifest(&self, id: &str) -> Option<Arc<Manifest>> {
        self.catalog()
            .entries
            .get(id)
            .map(|e| Arc::clone(&e.found.manifest))
    }

    /// Bytes of `id`'s weights (f32 parameters), from its manifest.
    pub fn weights(&self, id: &str) -> Option<u64> {
        let m = self.manifest(id)?;
        Some(m.layers.iter().map(|l| 4 * l.params).sum())
    }

    /// Loads `id` from disk onto this host's device (blocking; the device calls it).
    pub fn load(&self, id: &str) -> Result<ModelPackage, String> {
        let entry = self
            .catalog()
            .entries
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no model `{id}` on this host"))?;
        // The package as the host read it (its memory model is that package's), or none: a
        // reload keeps serving a package as first read, and a layer file changed since (its
        // size or time) was loaded under the old manifest and memory model.
        // The manifest is compared again once loaded: it may change between the two reads.
        let changed = || {
            format!(
                "model `{id}`: {} changed on disk since the host read it; the host serves the new package after a restart",
                entry.found.dir.display()
            )
        };
        let now = crate::policy::packages::read_package(&entry.found.dir);
        if now.as_ref().map(|f| &f.fingerprint) != Ok(&entry.found.fingerprint) {
            return Err(changed());
        }
        let pkg = ModelPackage::load(&entry.found.dir, self.device).map_err(|e| e.to_string())?;
        if pkg.manifest() != entry.found.manifest.as_ref() {
            return Err(changed());
        }
        Ok(pkg)
    }

    fn slot<T>(map: &Mutex<HashMap<String, Slot<T>>>, name: &str) -> Slot<T> {
        let mut map = lock(map);
        Arc::clone(map.entry(name.to_string()).or_default())
    }

    /// The memory model of `name`: kept (in this process or on disk), else measured on `pkg`
    /// (concurrent callers wait) and kept.
    pub fn memory(&self, name: &str, pkg: &ModelPackage) -> Result<Arc<ModelMemory>, String> {
        let catalog = self.catalog();
        let entry = catalog
            .entries
            .get(name)
            .ok_or_else(|| format!("no model `{name}` on this host"))?;
        measured(&entry.memory_key).get_or_make(|| self.kept_or_measured(name, entry, pkg))
    }

    /// The memory model of `id` if this process has it already (measured, or read from where
    /// it is kept); never loads or measures.
    pub fn memory_known(&self, id: &str) -> Option<Arc<ModelMemory>> {
        let catalog = self.catalog();
        measured(&catalog.entries.get(id)?.memory_key).done()
    }

    /// The memory model kept on disk under `key`, else measured and kept there.
    fn kept_or_measured(
        &self,
        name: &str,
        entry: &Entry,
        pkg: &ModelPackage,
    ) -> Result<Arc<ModelMemory>, String> {
        if let Some(m) = self.kept_model(entry) {
            return Ok(Arc::new(m));
        }
        let m = self.measure(name, pkg)?;
        self.keep(entry, &m);
        Ok(m)
    }

    /// Writes `m` where a restarted host finds it, whole or not at all (a failure is logged:
    /// it only costs a measurement at the next start).
    fn keep(&self, entry: &Entry, m: &ModelMemory) {
        let Some(f) = self.kept_file(entry) else {
            return;
        };
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let part = f.with_extension(format!("part-{}-{n}", std::process::id()));
        if let Err(e) = serde_json::to_vec(m)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&part, b))
            .and_then(|()| std::fs::rename(&part, &f))
        {
            tracing::warn!("not keeping the memory model at {}: {e}", f.display());
        }
    }

    fn kept_file(&self, entry: &Entry) -> Option<PathBuf> {
        self.kept
            .as_ref()
            .map(|dir| dir.join(format!("{}.json", entry.memory_key)))
    }

    /// The memory model kept on disk for `entry`, if any and whole.
    fn kept_model(&self, entry: &Entry) -> Option<ModelMemory> {
        self.kept_file(entry)
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<ModelMemory>(&b).ok())
            .filter(|m| m.layers.len() == entry.found.manifest.layers.len())
    }

    fn measure(&self, name: &str, pkg: &ModelPackage) -> Result<Arc<ModelMemory>, String> {
        let m = memory::measure(pkg).map_err(|e| format!("measuring `{name}`: {e}"))?;
        tracing::info!(
            "memory model of `{name}`: {} ({:.1}s), weights {} bytes",
            m.method,
            m.seconds,
            m.weights()
        );
        Ok(Arc::new(m))
    }

    /// The profile of `name`, if it was measured; or the error of a measurement that failed
    /// less than [`FAILURE_KEPT`] ago. Never waits.
    pub fn profiled(&self, name: &str) -> Option<Result<Arc<Vec<LayerProfile>>, String>> {
        let slot = Self::slot(&self.profiles, name);
        slot.done().map(Ok).or_else(|| slot.failed().map(Err))
    }

    /// A profile of model `name` measured at a smaller batch by `tenant` less than
    /// [`UNKEPT_FOR`] ago. Never waits.
    pub fn profiled_for(&self, name: &str, tenant: &str) -> Option<Arc<Vec<LayerProfile>>> {
        let unkept = lock(&self.unkept);
        let (at, layers) = unkept.get(&(name.to_string(), tenant.to_string()))?;
        (at.elapsed() < UNKEPT_FOR).then(|| Arc::clone(layers))
    }

    /// How long ago a measurement of model `name` for `tenant` stopped at its time limit, if
    /// less than [`UNKEPT_FOR`] ago and `limit` (the tenant's now) is no longer than it was
    /// then. Never waits.
    pub fn stopped_for(&self, name: &str, tenant: &str, limit: Duration) -> Option<Duration> {
        let stopped = lock(&self.stopped);
        let (at, then) = stopped.get(&(name.to_string(), tenant.to_string()))?;
        Some(at.elapsed()).filter(|ago| *ago < UNKEPT_FOR && limit <= *then)
    }

    /// A measurement of model `name` for `tenant` stopped at its time limit `limit`, having
    /// measured for most of it ([`Models::stopped_for`]).
    pub fn note_stopped(&self, name: &str, tenant: &str, limit: Duration) {
        let mut stopped = lock(&self.stopped);
        // At most one per (model, tenant), and none older than they are answered.
        stopped.retain(|_, (at, _)| at.elapsed() < UNKEPT_FOR);
        stopped.insert(
            (name.to_string(), tenant.to_string()),
            (Instant::now(), limit),
        );
    }

    /// Per-layer time per sample and output bytes on this host's device, measured on `pkg` at
    /// batch `batch` (the caller holds the memory that takes): kept for every later caller if
    /// `keep` (measured at the largest batch the budget can hold); if not, answered to `tenant`
    /// only, for [`UNKEPT_FOR`] ([`Models::profiled_for`]). A profile is a shared model's for
    /// all tenants: one measured at a smaller batch because a neighbour's work held the
    /// device's memory was kept, and every tenant planned its split from it until the host
    /// restarted. Measures while `go_on` answers true (it is asked before each run of a
    /// layer); `Ok(None)` when it stopped, and nothing is kept for anyone then (the caller may
    /// note the stop: [`Models::note_stopped`]).
    pub fn profile(
        &self,
        name: &str,
        pkg: &ModelPackage,
        batch: i64,
        keep: bool,
        tenant: &str,
        go_on: &dyn Fn() -> bool,
    ) -> Result<Option<Arc<Vec<LayerProfile>>>, String> {
        let measure = || {
            profile_layers_while(pkg, batch, PROFILE_REPS, go_on)
                .map(|m| m.map(Arc::new))
                .map_err(|e| e.to_string())
        };
        if !keep {
            let layers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(measure))
                .unwrap_or_else(|p| Err(format!("panicked: {}", panic_message(p.as_ref()))))?;
            let Some(layers) = layers else {
                return Ok(None);
            };
            let mut unkept = lock(&self.unkept);
            // At most one per (model, tenant), and none older than they are answered.
            unkept.retain(|_, (at, _)| at.elapsed() < UNKEPT_FOR);
            unkept.insert(
                (name.to_string(), tenant.to_string()),
                (Instant::now(), Arc::clone(&layers)),
            );
            return Ok(Some(layers));
        }
        Self::slot(&self.profiles, name).get_or_try(measure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_failure_is_answered_for_its_period_and_then_made_again() {
        let memo: Memo<u32> = Memo::keeping_failures(Duration::from_millis(300));
        let calls = AtomicUsize::new(0);
        let fail = || {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<Arc<u32>, _>("device out of memory".to_string())
        };
        assert_eq!(memo.get_or_make(fail), Err("device out of memory".into()));
        let kept = memo.get_or_make(fail).expect_err("kept failure");
        assert!(
            kept.starts_with("device out of memory (failed 0 s ago; tried again 0 s after"),
            "{kept}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "not made again within the period"
        );
        assert!(memo.done().is_none());
        let failed = memo.failed().expect("a kept failure");
        assert!(
            failed.starts_with("device out of memory (failed"),
            "{failed}"
        );
        std::thread::sleep(Duration::from_millis(350));
        assert!(memo.failed().is_none(), "past its period");
        let made = memo.get_or_make(|| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(7))
        });
        assert_eq!(made.map(|v| *v), Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Kept for good once made.
        let again = memo.get_or_make(fail);
        assert_eq!(again.map(|v| *v), Ok(7));
        assert_eq!(memo.done().map(|v| *v), Some(7));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_panic_while_making_is_a_kept_failure() {
        let memo: Memo<u32> = Memo::default();
        let made = memo.get_or_make(|| panic!("CUDA out of memory"));
        assert_eq!(made, Err("panicked: CUDA out of memory".into()));
        let kept = memo.failed().expect("kept like any failure");
        assert!(
            kept.starts_with("panicked: CUDA out of memory (failed"),
            "{kept}"
        );
        let again = memo.get_or_make(|| Ok(Arc::new(1)));
        assert!(again.is_err(), "not made again within the period");
    }

    #[test]
    fn done_and_failed_answer_while_it_is_made() {
        let memo: Arc<Memo<u32>> = Arc::new(Memo::default());
        let (asked, was_asked) = std::sync::mpsc::channel::<()>();
        let (started, has_started) = std::sync::mpsc::channel::<()>();
        let maker = {
            let memo = Arc::clone(&memo);
            std::thread::spawn(move || {
                memo.get_or_make(|| {
                    started.send(()).map_err(|e| e.to_string())?;
                    // Made only once the other thread's done() and failed() have answered.
                    was_asked
                        .recv_timeout(Duration::from_secs(5))
                        .map_err(|e| format!("not asked while making: {e}"))?;
                    Ok(Arc::new(1))
                })
            })
        };
        has_started.recv().expect("started");
        assert!(memo.done().is_none());
        assert!(memo.failed().is_none());
        asked.send(()).expect("asked");
        assert_eq!(maker.join().expect("no panic").map(|v| *v), Ok(1));
        assert_eq!(memo.done().map(|v| *v), Some(1));
    }

    #[test]
    fn callers_that_arrive_while_it_is_made_wait_for_it() {
        let memo: Arc<Memo<u32>> = Arc::new(Memo::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (memo, calls) = (Arc::clone(&memo), Arc::clone(&calls));
                std::thread::spawn(move || {
                    memo.get_or_make(|| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(100));
                        Ok(Arc::new(3))
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().expect("no panic").map(|v| *v), Ok(3));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
