//! The model packages this host serves: manifests read at start, segments loaded on first use,
//! per-layer profiles measured on first request and cached.

use crate::memory::{self, ModelMemory};
use hapi_model::profile::{LayerProfile, profile_layers};
use hapi_model::{Manifest, ModelPackage, list_packages};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
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
    loaded: Mutex<HashMap<String, Slot<ModelPackage>>>,
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
            loaded: Mutex::default(),
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

    fn slot<T>(map: &Mutex<HashMap<String, Slot<T>>>, name: &str) -> Slot<T> {
        let mut map = map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(map.entry(name.to_string()).or_default())
    }

    /// The loaded package (loaded once, on first use; concurrent callers wait for it).
    pub fn package(&self, name: &str) -> Result<Arc<ModelPackage>, String> {
        let (dir, _) = self
            .manifests
            .get(name)
            .ok_or_else(|| format!("no model `{name}` on this host"))?;
        Self::slot(&self.loaded, name)
            .get_or_init(|| {
                ModelPackage::load(dir, self.device)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// Per-layer time per sample and output bytes on this host's device (measured once).
    pub fn profile(&self, name: &str) -> Result<Arc<Vec<LayerProfile>>, String> {
        let pkg = self.package(name)?;
        Self::slot(&self.profiles, name)
            .get_or_init(|| {
                profile_layers(&pkg, PROFILE_BATCH, PROFILE_REPS)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// Per-layer memory on this host's device (measured once, on first use: see
    /// [`memory`](crate::memory)).
    pub fn memory(&self, name: &str) -> Result<Arc<ModelMemory>, String> {
        let pkg = self.package(name)?;
        Self::slot(&self.memory, name)
            .get_or_init(|| {
                let m = memory::measure(&pkg).map_err(|e| format!("measuring `{name}`: {e}"))?;
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
}
