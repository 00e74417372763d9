//! The model packages this host serves: manifests read at start, packages loaded when the
//! device asks (it decides what stays loaded), and per-model measurements made once and kept:
//! the memory model ([`crate::memory`]) and the per-layer profile.
//!
//! A memory model is also kept on disk (`<state>/memory/`), keyed by the package's manifest and
//! the device, and shared within the process: a restarted host, or a second host in the same
//! process, plans with the same model instead of measuring again (seconds per model, and a
//! measurement that varies a little from run to run).

use crate::memory;
use hapi_model::profile::profile_layers;
use hapi_model::{Manifest, ModelPackage, list_packages};
use hapi_wire::profile::{LayerProfile, ModelMemory};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use tch::Device;

/// Batch size of the profile endpoint's measurements.
pub const PROFILE_BATCH: i64 = 8;
/// Timed repetitions per layer (median reported).
pub const PROFILE_REPS: usize = 3;

type Slot<T> = Arc<OnceLock<Result<Arc<T>, String>>>;

/// Bumped when the measurement changes, so that kept models of an older one are not used.
const MEMORY_MODEL_VERSION: u32 = 1;

#[derive(Debug)]
pub struct Models {
    device: Device,
    manifests: BTreeMap<String, (PathBuf, Manifest)>,
    profiles: Mutex<HashMap<String, Slot<Vec<LayerProfile>>>>,
    /// What identifies each model's memory model: the package's manifest, the device, the
    /// measurement.
    memory_keys: BTreeMap<String, String>,
    /// Where memory models are kept across restarts.
    kept: Option<PathBuf>,
}

/// Memory models of this process, by key: hosts in one process (tests, benches) measure a
/// model once between them, the others waiting for it.
fn measured(key: &str) -> Slot<ModelMemory> {
    static M: OnceLock<Mutex<HashMap<String, Slot<ModelMemory>>>> = OnceLock::new();
    Models::slot(M.get_or_init(Mutex::default), key)
}

impl Models {
    /// Reads every package manifest under `dir`; a broken package is an error naming it.
    /// Memory models are kept under `kept` (created if need be).
    pub fn open(dir: &Path, device: Device, kept: Option<PathBuf>) -> anyhow::Result<Self> {
        let (mut manifests, mut memory_keys) = (BTreeMap::new(), BTreeMap::new());
        for pkg in list_packages(dir)? {
            let m = Manifest::load(&pkg)?;
            let file = pkg.join("manifest.json");
            let bytes = std::fs::read(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let digest = crate::policy::hash_bytes(&bytes);
            let key = format!(
                "{}-{}-{device:?}-v{MEMORY_MODEL_VERSION}",
                m.name,
                &digest[..16]
            );
            memory_keys.insert(m.name.clone(), key);
            manifests.insert(m.name.clone(), (pkg, m));
        }
        if let Some(k) = &kept {
            std::fs::create_dir_all(k)?;
        }
        Ok(Self {
            device,
            manifests,
            profiles: Mutex::default(),
            memory_keys,
            kept,
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn manifests(&self) -> impl Iterator<Item = &Manifest> {
        self.manifests.values().map(|(_, m)| m)
    }

    pub fn manifest(&self, name: &str) -> Option<&Manifest> {
        self.manifests.get(name).map(|(_, m)| m)
    }

    /// Bytes of `name`'s weights (f32 parameters), from its manifest.
    pub fn weights(&self, name: &str) -> Option<u64> {
        let m = self.manifest(name)?;
        Some(m.layers.iter().map(|l| 4 * l.params).sum())
    }

    /// Loads `name` from disk onto this host's device (blocking; the device calls it).
    pub fn load(&self, name: &str) -> Result<ModelPackage, String> {
        let (dir, _) = self
            .manifests
            .get(name)
            .ok_or_else(|| format!("no model `{name}` on this host"))?;
        ModelPackage::load(dir, self.device).map_err(|e| e.to_string())
    }

    fn slot<T>(map: &Mutex<HashMap<String, Slot<T>>>, name: &str) -> Slot<T> {
        let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(name.to_string()).or_default())
    }

    /// The memory model of `name`: kept (in this process or on disk), else measured on `pkg`
    /// (concurrent callers wait) and kept.
    pub fn memory(&self, name: &str, pkg: &ModelPackage) -> Result<Arc<ModelMemory>, String> {
        let key = self
            .memory_keys
            .get(name)
            .ok_or_else(|| format!("no model `{name}` on this host"))?;
        measured(key)
            .get_or_init(|| self.kept_or_measured(name, key, pkg))
            .clone()
    }

    /// The memory model kept on disk under `key`, else measured and kept there.
    fn kept_or_measured(
        &self,
        name: &str,
        key: &str,
        pkg: &ModelPackage,
    ) -> Result<Arc<ModelMemory>, String> {
        let file = self
            .kept
            .as_ref()
            .map(|dir| dir.join(format!("{key}.json")));
        let kept = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<ModelMemory>(&b).ok())
            .filter(|m| m.layers.len() == pkg.num_layers());
        if let Some(m) = kept {
            return Ok(Arc::new(m));
        }
        let m = self.measure(name, pkg)?;
        if let Some(f) = &file
            && let Err(e) = serde_json::to_vec(m.as_ref())
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(f, b))
        {
            tracing::warn!("not keeping the memory model at {}: {e}", f.display());
        }
        Ok(m)
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

    /// Per-layer time per sample and output bytes on this host's device, measured on `pkg`
    /// the first time.
    pub fn profile(
        &self,
        name: &str,
        pkg: &ModelPackage,
    ) -> Result<Arc<Vec<LayerProfile>>, String> {
        Self::slot(&self.profiles, name)
            .get_or_init(|| {
                profile_layers(pkg, PROFILE_BATCH, PROFILE_REPS)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }
}
