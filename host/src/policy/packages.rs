//! The model packages a policy names, as found on disk: the shared directories' and each
//! tenant's private ones, read and checked (what [`crate::models`] serves, and what
//! [`super::Policy::load`] checks names against).

use super::Policy;
use hapi_model::{Manifest, list_packages};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One package found in a models directory.
#[derive(Debug, Clone)]
pub struct Found {
    pub dir: PathBuf,
    pub manifest: Arc<Manifest>,
    /// sha256 of `manifest.json`.
    pub manifest_digest: String,
    /// The manifest's digest with every layer file's size and modification time: tells a
    /// package changed on disk (what the memory model is keyed by).
    pub fingerprint: String,
}

/// Reads every package in `dirs`, by manifest name; a broken package, an unreadable directory
/// or one name in two packages is an error naming the paths.
pub fn scan(dirs: &[PathBuf]) -> Result<BTreeMap<String, Found>, String> {
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    for dir in dirs {
        for pkg in list_packages(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let f = read_package(&pkg)?;
            if let Some(other) = found.get(&f.manifest.name) {
                return Err(format!(
                    "two packages are named `{}`: {} and {}",
                    f.manifest.name,
                    other.dir.display(),
                    pkg.display()
                ));
            }
            found.insert(f.manifest.name.clone(), f);
        }
    }
    Ok(found)
}

/// The package in `pkg` as it is on disk now.
pub fn read_package(pkg: &Path) -> Result<Found, String> {
    let (m, bytes) = Manifest::load_with_bytes(pkg).map_err(|e| e.to_string())?;
    let manifest_digest = super::hash_bytes(&bytes);
    let mut stamp = manifest_digest.clone();
    for l in &m.layers {
        // A missing file is the package loader's error to report, with its layer.
        if let Ok(meta) = std::fs::metadata(pkg.join(&l.file)) {
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            stamp.push_str(&format!(" {}:{}:{mtime}", l.file, meta.len()));
        }
    }
    Ok(Found {
        dir: pkg.to_path_buf(),
        manifest: Arc::new(m),
        manifest_digest,
        fingerprint: super::hash_bytes(stamp.as_bytes()),
    })
}

/// The packages a policy names: the shared ones by name, each tenant's private ones by tenant
/// and name. Errors name the policy key.
#[derive(Debug, Default, Clone)]
pub struct PolicyModels {
    pub shared: BTreeMap<String, Found>,
    pub private: BTreeMap<String, BTreeMap<String, Found>>,
}

impl PolicyModels {
    /// Reads `host.models` and every tenant's `private_models`.
    pub fn read(policy: &Policy) -> Result<Self, String> {
        let shared = scan(&policy.host.models).map_err(|e| format!("host.models: {e}"))?;
        let mut private = BTreeMap::new();
        for t in policy.tenants.values() {
            if t.private_models.is_empty() {
                continue;
            }
            let mine = scan(&t.private_models)
                .map_err(|e| format!("tenants.{}.private_models: {e}", t.name))?;
            private.insert(t.name.clone(), mine);
        }
        Ok(Self { shared, private })
    }
}
