//! The feature store: the frozen layers' output (the head's input) of every sample a job has
//! seen, kept on the compute node and reused by any later job on the same data, so that a sweep
//! of heads or learning rates pays the extraction once.
//!
//! A store directory holds one folder per *identity*: what the features depend on besides the
//! object itself (the store and bucket, the function, the model's manifest and the weights of its
//! frozen layers, the freeze index, the element type). Inside it:
//!
//! - `identity.json`: the identity, readable;
//! - `shard-NNNNNN.safetensors`: one tensor `features` (`[rows, ...sample shape]`, F32) per shard,
//!   written whole (a temporary file renamed into place), never changed afterwards;
//! - `index.json`: for each object key, its version when it was extracted (entity tag, size and
//!   modification time, as the listing gave them) and where its row is;
//! - `.lock`: held while a job adds a shard and rewrites the index, so that jobs running at the
//!   same time each add theirs.
//!
//! A sample is served from the store only when its key and version match; an object rewritten
//! since has another version and is extracted again. A damaged index or shard is reported and
//! treated as missing: the store is a cache, and the job recomputes what it cannot read.
//!
//! With a size cap ([`enforce_cap`], `hapi-train --feature-store-cap`), shards no index refers
//! to any more (their rows were all extracted again since) are deleted, then whole shards are
//! evicted, least recently used first over every identity in the directory, until the shards
//! fit: a shard's modification time is set when a job reads it. An evicted shard's entries
//! leave its index first (under that identity's lock), so no job is ever pointed at a missing
//! file; its samples are simply extracted again by the next job that needs them.

use crate::dataset::Sample;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What the features of one object depend on, other than the object's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The object store (a canonical directory, or the URL and endpoint) and bucket.
    pub store: String,
    pub bucket: String,
    /// The pushdown function that extracted them (another function may preprocess otherwise).
    pub function: String,
    pub model: String,
    /// SHA-256 of the manifest (preprocessing included) and of the frozen layers' files.
    pub package_digest: String,
    pub freeze: usize,
    /// Element type of the stored features.
    pub dtype: String,
    /// Shape of one sample's features.
    pub sample_shape: Vec<i64>,
}

impl Identity {
    /// The folder name: a digest of the whole identity.
    fn digest(&self) -> String {
        let text = serde_json::to_vec(self).unwrap_or_default();
        hex(&Sha256::digest(&text))[..32].to_string()
    }
}

/// SHA-256 over the package's manifest and the files of layers `[0, freeze)`.
pub fn package_digest(pkg: &hapi_model::ModelPackage, freeze: usize) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    let mut add = |path: &Path| -> anyhow::Result<()> {
        let mut f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        // Separates files, so that moving bytes from one file to the next changes the digest.
        h.update(b"\0file\0");
        Ok(())
    };
    add(&pkg.dir().join("manifest.json"))?;
    for layer in &pkg.manifest().layers[..freeze] {
        add(&pkg.dir().join(&layer.file))?;
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where one object's row is.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    /// The object's version when it was extracted ([`Sample::version`]).
    version: String,
    shard: u32,
    row: u32,
}

#[derive(Default, Serialize, Deserialize)]
struct Index {
    entries: BTreeMap<String, Entry>,
}

/// One identity's folder in a store directory.
#[derive(Debug)]
pub struct FeatureStore {
    dir: PathBuf,
    identity: Identity,
    /// Elements per sample.
    per_sample: usize,
}

/// What [`FeatureStore::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Features by key, for the samples whose key and version matched.
    pub features: HashMap<String, Vec<f32>>,
    /// Samples the store had under another version (the object changed since).
    pub stale: usize,
    /// Problems met (a damaged shard or index), one line each; those samples count as missing.
    pub warnings: Vec<String>,
}

impl FeatureStore {
    /// Opens (creating it if needed) the folder of `identity` under `root`.
    pub fn open(root: &Path, identity: Identity) -> anyhow::Result<Self> {
        let dir = root.join(identity.digest());
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("feature store: creating {}", dir.display()))?;
        let id_path = dir.join("identity.json");
        if !id_path.is_file() {
            write_atomic(&id_path, &serde_json::to_vec_pretty(&identity)?)?;
        }
        let per_sample = identity.sample_shape.iter().product::<i64>().max(0) as usize;
        anyhow::ensure!(
            per_sample > 0,
            "feature store: a sample shape of {:?} holds nothing",
            identity.sample_shape
        );
        Ok(Self {
            dir,
            identity,
            per_sample,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn shard_path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("shard-{n:06}.safetensors"))
    }

    /// The index as on disk; a missing one is empty, a damaged one is empty plus a warning.
    fn read_index(&self, warnings: &mut Vec<String>) -> Index {
        let path = self.index_path();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                warnings.push(format!(
                    "{}: not a feature-store index ({e}); everything will be extracted again",
                    path.display()
                ));
                Index::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Index::default(),
            Err(e) => {
                warnings.push(format!("{}: {e}", path.display()));
                Index::default()
            }
        }
    }

    /// The features of those `samples` that the store holds at their current version.
    pub fn load<'a>(&self, samples: impl IntoIterator<Item = &'a Sample>) -> Loaded {
        let mut out = Loaded::default();
        let index = self.read_index(&mut out.warnings);
        // Wanted rows, by shard.
        let mut wanted: BTreeMap<u32, Vec<(&str, u32)>> = BTreeMap::new();
        for s in samples {
            match index.entries.get(&s.key) {
                Some(e) if e.version == s.version => {
                    wanted.entry(e.shard).or_default().push((&s.key, e.row));
                }
                Some(_) => out.stale += 1,
                None => {}
            }
        }
        for (shard, rows) in wanted {
            let path = self.shard_path(shard);
            match self.read_shard(&path) {
                Ok(data) => {
                    touch(&path);
                    let n = data.len() / self.per_sample;
                    for (key, row) in rows {
                        let row = row as usize;
                        if row >= n {
                            out.warnings.push(format!(
                                "{}: row {row} of `{key}` is past its {n} rows",
                                path.display()
                            ));
                            continue;
                        }
                        let at = row * self.per_sample;
                        out.features
                            .insert(key.to_string(), data[at..at + self.per_sample].to_vec());
                    }
                }
                Err(e) => out.warnings.push(format!(
                    "{}: {e:#}; its {} samples will be extracted again",
                    path.display(),
                    rows.len()
                )),
            }
        }
        out
    }

    /// A shard's features, flat, after checking its type and shape.
    fn read_shard(&self, path: &Path) -> anyhow::Result<Vec<f32>> {
        let bytes = std::fs::read(path)?;
        let st = safetensors::SafeTensors::deserialize(&bytes).context("not a safetensors file")?;
        let t = st
            .tensor(hapi_wire::tensor::FEATURES)
            .context("no `features` tensor")?;
        anyhow::ensure!(
            t.dtype() == safetensors::Dtype::F32,
            "features of {:?}, expected F32",
            t.dtype()
        );
        let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        anyhow::ensure!(
            shape.len() == self.identity.sample_shape.len() + 1
                && shape[1..] == self.identity.sample_shape[..],
            "features of shape {shape:?}, expected [rows, {:?}]",
            self.identity.sample_shape
        );
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Adds the features of `samples` (`features[key]`, each of the identity's sample shape) as
    /// a new shard and records them in the index. Returns the shard's path.
    pub fn add(
        &self,
        samples: &[&Sample],
        features: &HashMap<String, Vec<f32>>,
    ) -> anyhow::Result<Option<PathBuf>> {
        let mut data: Vec<u8> = Vec::with_capacity(samples.len() * self.per_sample * 4);
        let mut rows = Vec::with_capacity(samples.len());
        for s in samples {
            let Some(f) = features.get(&s.key) else {
                continue;
            };
            anyhow::ensure!(
                f.len() == self.per_sample,
                "`{}`: {} feature values, expected {} ({:?})",
                s.key,
                f.len(),
                self.per_sample,
                self.identity.sample_shape
            );
            for v in f {
                data.extend_from_slice(&v.to_le_bytes());
            }
            rows.push(*s);
        }
        if rows.is_empty() {
            return Ok(None);
        }
        let lock = lock_dir(&self.dir)?;
        let mut warnings = Vec::new();
        let mut index = self.read_index(&mut warnings);
        for w in warnings {
            eprintln!("feature store: {w}");
        }
        // The next shard number not taken (by the index or by a file a crashed job left).
        let mut shard = index
            .entries
            .values()
            .map(|e| e.shard + 1)
            .max()
            .unwrap_or(1);
        while self.shard_path(shard).exists() {
            shard += 1;
        }
        let shape: Vec<u64> = std::iter::once(rows.len() as u64)
            .chain(self.identity.sample_shape.iter().map(|&d| d as u64))
            .collect();
        let meta = BTreeMap::from([("model".to_string(), self.identity.model.clone())]);
        let mut file = hapi_wire::tensor::header(
            hapi_wire::tensor::Dtype::F32,
            &shape,
            data.len() as u64,
            &meta,
        )
        .map_err(|e| anyhow::anyhow!("feature store: {e}"))?;
        file.extend_from_slice(&data);
        let path = self.shard_path(shard);
        write_atomic(&path, &file)?;
        for (row, s) in rows.iter().enumerate() {
            index.entries.insert(
                s.key.clone(),
                Entry {
                    version: s.version.clone(),
                    shard,
                    row: row as u32,
                },
            );
        }
        write_atomic(&self.index_path(), &serde_json::to_vec(&index)?)?;
        drop(lock);
        Ok(Some(path))
    }
}

/// Holds the `.lock` of an identity's folder until dropped.
fn lock_dir(dir: &Path) -> anyhow::Result<File> {
    let lock_path = dir.join(".lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("feature store: {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("feature store: locking {}", lock_path.display()))?;
    Ok(lock)
}

/// Marks a shard as just used (its modification time); eviction goes by it.
fn touch(path: &Path) {
    if let Ok(f) = File::options().append(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// The shard number in a file name `shard-NNNNNN.safetensors`.
fn shard_number(name: &str) -> Option<u32> {
    name.strip_prefix("shard-")?
        .strip_suffix(".safetensors")?
        .parse()
        .ok()
}

/// What [`enforce_cap`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Shards no index referred to, deleted.
    pub garbage: usize,
    /// Shards evicted to fit the cap, and the samples they held.
    pub evicted: usize,
    pub evicted_samples: usize,
    /// Bytes of shards left.
    pub bytes: u64,
}

/// Keeps the shards of every identity under `root` within `cap` bytes: unreferenced shards
/// go, then the least recently used ones (see the module's documentation). Takes one
/// identity's lock at a time.
pub fn enforce_cap(root: &Path, cap: u64) -> anyhow::Result<Enforced> {
    let mut out = Enforced::default();
    // (last used, bytes, identity folder, shard number) of every referenced shard.
    let mut shards: Vec<(std::time::SystemTime, u64, PathBuf, u32)> = Vec::new();
    let dirs = std::fs::read_dir(root)
        .with_context(|| format!("feature store: reading {}", root.display()))?;
    for d in dirs {
        let dir = d?.path();
        if !dir.join("identity.json").is_file() {
            continue;
        }
        let _lock = lock_dir(&dir)?;
        let Ok(bytes) = std::fs::read(dir.join("index.json")) else {
            continue;
        };
        let Ok(index) = serde_json::from_slice::<Index>(&bytes) else {
            continue; // a damaged index: the next job that opens it reports it
        };
        let used: std::collections::BTreeSet<u32> =
            index.entries.values().map(|e| e.shard).collect();
        for f in std::fs::read_dir(&dir)? {
            let f = f?;
            let name = f.file_name();
            let Some(n) = name.to_str().and_then(shard_number) else {
                continue;
            };
            let meta = f.metadata()?;
            if used.contains(&n) {
                shards.push((meta.modified()?, meta.len(), dir.clone(), n));
            } else {
                std::fs::remove_file(f.path())
                    .with_context(|| format!("feature store: removing {}", f.path().display()))?;
                out.garbage += 1;
            }
        }
    }
    let mut total: u64 = shards.iter().map(|s| s.1).sum();
    shards.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.3.cmp(&b.3)));
    for (_, bytes, dir, n) in shards {
        if total <= cap {
            break;
        }
        let _lock = lock_dir(&dir)?;
        let index_path = dir.join("index.json");
        let mut index: Index = serde_json::from_slice(
            &std::fs::read(&index_path)
                .with_context(|| format!("feature store: {}", index_path.display()))?,
        )
        .with_context(|| format!("feature store: {}", index_path.display()))?;
        let before = index.entries.len();
        index.entries.retain(|_, e| e.shard != n);
        out.evicted_samples += before - index.entries.len();
        write_atomic(&index_path, &serde_json::to_vec(&index)?)?;
        let path = dir.join(format!("shard-{n:06}.safetensors"));
        std::fs::remove_file(&path)
            .with_context(|| format!("feature store: removing {}", path.display()))?;
        out.evicted += 1;
        total -= bytes;
    }
    out.bytes = total;
    Ok(out)
}

/// Writes `bytes` to a temporary file beside `path` and renames it into place.
fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(key: &str) -> Sample {
        Sample {
            key: key.into(),
            label: 0,
            version: "v1".into(),
        }
    }

    fn identity(model: &str) -> Identity {
        Identity {
            store: "/data".into(),
            bucket: "b".into(),
            function: "feature-extract".into(),
            model: model.into(),
            package_digest: "d".into(),
            freeze: 1,
            dtype: "f32".into(),
            sample_shape: vec![4],
        }
    }

    fn add(fs: &FeatureStore, keys: &[&str]) -> PathBuf {
        let samples: Vec<Sample> = keys.iter().map(|k| sample(k)).collect();
        let refs: Vec<&Sample> = samples.iter().collect();
        let features = keys
            .iter()
            .map(|k| (k.to_string(), vec![1.0f32; 4]))
            .collect();
        fs.add(&refs, &features).expect("added").expect("a shard")
    }

    fn set_age(path: &Path, secs_ago: u64) {
        let f = File::options().append(true).open(path).expect("shard");
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(secs_ago))
            .expect("mtime");
    }

    #[test]
    fn the_cap_evicts_the_least_recently_used_shards_over_every_identity_and_unlists_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = FeatureStore::open(root.path(), identity("a")).expect("a");
        let b = FeatureStore::open(root.path(), identity("b")).expect("b");
        let a1 = add(&a, &["x", "y"]);
        let b1 = add(&b, &["x"]);
        let a2 = add(&a, &["z"]);
        // Oldest use first: a1, then b1, then a2.
        set_age(&a1, 300);
        set_age(&b1, 200);
        set_age(&a2, 100);
        let size = |p: &Path| std::fs::metadata(p).expect("size").len();
        let all = size(&a1) + size(&b1) + size(&a2);
        // Under the cap: nothing goes.
        let e = enforce_cap(root.path(), all).expect("enforced");
        assert_eq!((e.garbage, e.evicted, e.bytes), (0, 0, all));
        // Reading a1 makes it the most recent: b1 goes first now.
        let got = a.load([&sample("x")]);
        assert_eq!(got.features.len(), 1);
        let e = enforce_cap(root.path(), all - 1).expect("enforced");
        assert_eq!((e.evicted, e.evicted_samples), (1, 1), "{e:?}");
        assert!(!b1.exists() && a1.exists() && a2.exists());
        assert!(b.load([&sample("x")]).features.is_empty());
        // A cap of nothing empties the store, and the index lists nothing missing.
        let e = enforce_cap(root.path(), 0).expect("enforced");
        assert_eq!((e.evicted, e.evicted_samples, e.bytes), (2, 3, 0), "{e:?}");
        let left = a.load([&sample("x"), &sample("y"), &sample("z")]);
        assert!(
            left.features.is_empty() && left.warnings.is_empty(),
            "{left:?}"
        );
    }

    #[test]
    fn shards_whose_rows_were_all_extracted_again_are_garbage() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = FeatureStore::open(root.path(), identity("a")).expect("a");
        let old = add(&a, &["x"]);
        let new = add(&a, &["x"]); // x again: the index points at the new shard
        let e = enforce_cap(root.path(), u64::MAX).expect("enforced");
        assert_eq!((e.garbage, e.evicted), (1, 0));
        assert!(!old.exists() && new.exists());
        assert_eq!(a.load([&sample("x")]).features.len(), 1);
    }
}
