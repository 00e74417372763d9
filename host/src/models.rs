//! The model packages this host serves: manifests read at start, packages loaded when the
//! device asks (it decides what stays loaded), and per-model measurements made once and kept:
//! the memory model ([`crate::memory`]) and the per-layer profile.

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

#[derive(Debug)]
pub struct Models {
    device: Device,
    manifests: BTreeMap<String, (PathBuf, Manifest)>,
    profiles: Mutex<HashMap<String, Slot<Vec<LayerProfile>>>>,
    memory: Mutex<HashMap<String, Slot<ModelMemory>>>,
}

impl Models {
    /// Reads every package manifest under `dir`; a broken package is an error naming it.
    pub fn open(dir: &Path, device: Device) -> anyhow::Result<Self> {
        let mut manifests = BTreeMap::new();
        for pkg in list_packages(dir)? {
            let m = Manifest::load(&pkg)?;
            manifests.insert(m.name.clone(), (pkg, m));
        }
        Ok(Self {
            device,
            manifests,
            profiles: Mutex::default(),
            memory: Mutex::default(),
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

    /// The memory model of `name`, measured on `pkg` the first time (concurrent callers wait).
    pub fn memory(&self, name: &str, pkg: &ModelPackage) -> Result<Arc<ModelMemory>, String> {
        Self::slot(&self.memory, name)
            .get_or_init(|| {
                let m = memory::measure(pkg).map_err(|e| format!("measuring `{name}`: {e}"))?;
                tracing::info!(
                    "memory model of `{name}`: {} ({:.1}s), weights {} bytes",
                    m.method,
                    m.seconds,
                    m.weights()
                );
                Ok(Arc::new(m))
            })
            .clone()
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
