//! The `objects` capability: a tenant's read access to its granted buckets and prefixes.
//!
//! The store is a directory whose subdirectories are buckets, opened once with cap-std; every
//! later access goes through that handle, so no key can reach outside it (cap-std refuses
//! `..`, absolute paths and symlinks that escape). Before that, keys are checked against the
//! tenant's grants, and byte caps bound what one object and one invocation may read.

use crate::policy::{Grant, Tenant};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// Longest key accepted (S3's limit).
pub const MAX_KEY_BYTES: usize = 1024;
/// Most entries one `list` call returns.
pub const MAX_LIST: u32 = 10_000;
/// Most directory entries one `list` call visits, so a huge bucket cannot stall the host.
pub const MAX_LIST_VISITS: usize = 200_000;

/// Why an object operation failed (mirrors the WIT `object-error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("too large: over the cap of {0} bytes")]
    TooLarge(u64),
    #[error("i/o: {0}")]
    Io(String),
}

/// What `head` and `list` return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    pub last_modified_ms: u64,
}

/// The object store root: the one place with ambient authority.
#[derive(Debug)]
pub struct Store {
    root: Dir,
}

impl Store {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: Dir::open_ambient_dir(path, ambient_authority())?,
        })
    }

    fn bucket(&self, name: &str) -> Result<Dir, ObjectError> {
        self.root.open_dir(name).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ObjectError::NotFound(format!("bucket `{name}`")),
            _ => ObjectError::Io(format!("bucket `{name}`: {e}")),
        })
    }
}

/// Checks that `key` is a plain relative object key.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("empty key".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!("key is {} bytes (max {MAX_KEY_BYTES})", key.len()));
    }
    if key.starts_with('/') {
        return Err(format!("`{key}` is absolute"));
    }
    if key.contains('\\') || key.contains('\0') {
        return Err(format!("`{}` contains `\\` or NUL", key.escape_debug()));
    }
    if key
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!("`{key}` has an empty, `.` or `..` segment"));
    }
    Ok(())
}

fn grant_prefix(g: &Grant) -> String {
    if g.prefix.is_empty() || g.prefix.ends_with('/') {
        g.prefix.clone()
    } else {
        // A prefix names a directory: `data` grants `data/...`, not `data-secret/...`.
        format!("{}/", g.prefix)
    }
}

/// One invocation's view of the objects: its tenant's grants and its byte budget.
#[derive(Debug)]
pub struct Objects {
    tenant: Arc<Tenant>,
    store: Arc<Store>,
    /// Bytes read so far by this invocation.
    pub bytes_read: u64,
}

impl Objects {
    pub fn new(tenant: Arc<Tenant>, store: Arc<Store>) -> Self {
        Self {
            tenant,
            store,
            bytes_read: 0,
        }
    }

    /// The bucket handle, if `bucket`/`key` (or a key prefix) is within a grant.
    fn authorise(&self, bucket: &str, key: &str, is_prefix: bool) -> Result<Dir, ObjectError> {
        if is_prefix {
            if !crate::policy::valid_key_part(key) {
                return Err(ObjectError::Denied(format!(
                    "prefix `{key}` is not a relative key prefix"
                )));
            }
        } else {
            check_key(key).map_err(ObjectError::Denied)?;
        }
        if !self.granted(bucket, key, is_prefix) {
            return Err(ObjectError::Denied(format!(
                "`{bucket}/{key}` is outside tenant `{}`'s grants",
                self.tenant.name
            )));
        }
        self.store.bucket(bucket)
    }

    fn granted(&self, bucket: &str, key: &str, is_prefix: bool) -> bool {
        self.tenant.grants.iter().any(|g| {
            let p = grant_prefix(g);
            g.bucket == bucket && (key.starts_with(&p) || (is_prefix && p.starts_with(key)))
        })
    }

    fn charge(&mut self, n: u64) -> Result<(), ObjectError> {
        let max = self.tenant.limits.max_read;
        if self.bytes_read.saturating_add(n) > max {
            return Err(ObjectError::TooLarge(max));
        }
        self.bytes_read += n;
        Ok(())
    }

    fn open(&self, dir: &Dir, key: &str) -> Result<cap_std::fs::File, ObjectError> {
        dir.open(key).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ObjectError::NotFound(key.to_string()),
            std::io::ErrorKind::PermissionDenied => ObjectError::Denied(key.to_string()),
            _ => ObjectError::Io(format!("{key}: {e}")),
        })
    }

    pub fn get(&mut self, bucket: &str, key: &str) -> Result<Vec<u8>, ObjectError> {
        let dir = self.authorise(bucket, key, false)?;
        let mut file = self.open(&dir, key)?;
        let len = file
            .metadata()
            .map_err(|e| ObjectError::Io(format!("{key}: {e}")))?
            .len();
        if !file
            .metadata()
            .map_err(|e| ObjectError::Io(e.to_string()))?
            .is_file()
        {
            return Err(ObjectError::NotFound(key.to_string()));
        }
        if len > self.tenant.limits.max_object {
            return Err(ObjectError::TooLarge(self.tenant.limits.max_object));
        }
        self.charge(len)?;
        let mut buf = Vec::with_capacity(len as usize);
        // Read at most what was charged, even if the file grows meanwhile.
        (&mut file)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|e| ObjectError::Io(format!("{key}: {e}")))?;
        Ok(buf)
    }

    pub fn get_range(
        &mut self,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, ObjectError> {
        let dir = self.authorise(bucket, key, false)?;
        let mut file = self.open(&dir, key)?;
        let size = file
            .metadata()
            .map_err(|e| ObjectError::Io(format!("{key}: {e}")))?
            .len();
        let length = length.min(size.saturating_sub(offset));
        if length > self.tenant.limits.max_object {
            return Err(ObjectError::TooLarge(self.tenant.limits.max_object));
        }
        self.charge(length)?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| ObjectError::Io(format!("{key}: {e}")))?;
        let mut buf = Vec::with_capacity(length as usize);
        file.take(length)
            .read_to_end(&mut buf)
            .map_err(|e| ObjectError::Io(format!("{key}: {e}")))?;
        Ok(buf)
    }

    pub fn head(&mut self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        let dir = self.authorise(bucket, key, false)?;
        let meta = dir.metadata(key).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ObjectError::NotFound(key.to_string()),
            _ => ObjectError::Io(format!("{key}: {e}")),
        })?;
        if !meta.is_file() {
            return Err(ObjectError::NotFound(key.to_string()));
        }
        Ok(ObjectMeta {
            key: key.to_string(),
            size: meta.len(),
            last_modified_ms: modified_ms(&meta),
        })
    }

    /// Objects under `prefix` in key order, at most `limit` (and [`MAX_LIST`]).
    pub fn list(
        &mut self,
        bucket: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        let dir = self.authorise(bucket, prefix, true)?;
        let limit = limit.min(MAX_LIST) as usize;
        // Walk from the deepest directory the prefix names, then filter by the full prefix
        // and by the grants (a prefix may be wider than the grant, e.g. "" in a bucket whose
        // grant is "a/").
        let (start, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let root = if start.is_empty() {
            dir.try_clone()
                .map_err(|e| ObjectError::Io(e.to_string()))?
        } else {
            match dir.open_dir(start) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(ObjectError::Io(format!("{start}: {e}"))),
            }
        };
        let mut out = Vec::new();
        let mut visits = 0usize;
        let mut stack = vec![(root, start.to_string())];
        while let Some((d, path)) = stack.pop() {
            let entries = d
                .entries()
                .map_err(|e| ObjectError::Io(format!("{path}: {e}")))?;
            for entry in entries {
                visits += 1;
                if visits > MAX_LIST_VISITS {
                    return Err(ObjectError::TooLarge(MAX_LIST_VISITS as u64));
                }
                let entry = entry.map_err(|e| ObjectError::Io(e.to_string()))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let key = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}/{name}")
                };
                let ft = entry
                    .file_type()
                    .map_err(|e| ObjectError::Io(e.to_string()))?;
                if ft.is_dir() {
                    if key.starts_with(prefix) || prefix.starts_with(&format!("{key}/")) {
                        let sub = d
                            .open_dir(&name)
                            .map_err(|e| ObjectError::Io(format!("{key}: {e}")))?;
                        stack.push((sub, key));
                    }
                } else if ft.is_file()
                    && key.starts_with(prefix)
                    && self.granted(bucket, &key, false)
                {
                    let meta = entry
                        .metadata()
                        .map_err(|e| ObjectError::Io(e.to_string()))?;
                    out.push(ObjectMeta {
                        key,
                        size: meta.len(),
                        last_modified_ms: modified_ms(&meta),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.truncate(limit);
        Ok(out)
    }
}

fn modified_ms(meta: &cap_std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}
