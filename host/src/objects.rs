//! The `objects` capability: a tenant's read access to its granted buckets and prefixes.
//!
//! Keys are checked against the tenant's grants before any store is touched, and byte caps
//! bound what one object and one invocation may read. Two backends do the I/O:
//!
//! - local (the default): a directory whose subdirectories are buckets, opened once with
//!   cap-std; every access goes through that handle, so no key can reach outside it (cap-std
//!   refuses `..`, absolute paths and symlinks that escape);
//! - S3: any S3 service through `object_store`, one client per bucket.

use crate::policy::{Grant, S3Settings, StoreLocation, Tenant};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::UNIX_EPOCH;

/// Longest key accepted (S3's limit).
pub const MAX_KEY_BYTES: usize = 1024;
/// Most entries one `list` call returns.
pub const MAX_LIST: u32 = 10_000;
/// Most entries one `list` call visits, so a huge bucket cannot stall the host.
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
    pub etag: Option<String>,
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

/// The object store the host reads from.
#[derive(Debug)]
pub enum Store {
    Local(Local),
    S3(Box<S3>),
}

impl Store {
    pub fn open(location: &StoreLocation) -> anyhow::Result<Self> {
        Ok(match location {
            StoreLocation::Local(path) => Store::Local(Local {
                root: Dir::open_ambient_dir(path, ambient_authority())?,
            }),
            StoreLocation::S3(settings) => Store::S3(Box::new(S3::new(settings.clone())?)),
        })
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
        max_object: u64,
        charge: &mut dyn FnMut(u64) -> Result<(), ObjectError>,
    ) -> Result<Vec<u8>, ObjectError> {
        match self {
            Store::Local(l) => l.get(bucket, key, max_object, charge),
            Store::S3(s) => s.get(bucket, key, max_object, charge),
        }
    }

    fn get_range(
        &self,
        bucket: &str,
        key: &str,
        range: (u64, u64),
        max_object: u64,
        charge: &mut dyn FnMut(u64) -> Result<(), ObjectError>,
    ) -> Result<Vec<u8>, ObjectError> {
        match self {
            Store::Local(l) => l.get_range(bucket, key, range, max_object, charge),
            Store::S3(s) => s.get_range(bucket, key, range, max_object, charge),
        }
    }

    fn head(&self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        match self {
            Store::Local(l) => l.head(bucket, key),
            Store::S3(s) => s.head(bucket, key),
        }
    }

    /// Objects whose keys start with `prefix` and pass `keep`, unsorted.
    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        match self {
            Store::Local(l) => l.list(bucket, prefix, keep),
            Store::S3(s) => s.list(bucket, prefix, keep),
        }
    }
}

fn io_err(key: &str, e: impl std::fmt::Display) -> ObjectError {
    ObjectError::Io(format!("{key}: {e}"))
}

/// Local directory store, through cap-std.
#[derive(Debug)]
pub struct Local {
    root: Dir,
}

impl Local {
    fn bucket(&self, name: &str) -> Result<Dir, ObjectError> {
        self.root.open_dir(name).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ObjectError::NotFound(format!("bucket `{name}`")),
            _ => ObjectError::Io(format!("bucket `{name}`: {e}")),
        })
    }

    fn open(&self, bucket: &str, key: &str) -> Result<(cap_std::fs::File, u64), ObjectError> {
        let file = self.bucket(bucket)?.open(key).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ObjectError::NotFound(key.to_string()),
            std::io::ErrorKind::PermissionDenied => ObjectError::Denied(key.to_string()),
            _ => io_err(key, e),
        })?;
        let meta = file.metadata().map_err(|e| io_err(key, e))?;
        if !meta.is_file() {
            return Err(ObjectError::NotFound(key.to_string()));
        }
        Ok((file, meta.len()))
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
        max_object: u64,
        charge: &mut dyn FnMut(u64) -> Result<(), ObjectError>,
    ) -> Result<Vec<u8>, ObjectError> {
        let (file, len) = self.open(bucket, key)?;
        if len > max_object {
            return Err(ObjectError::TooLarge(max_object));
        }
        charge(len)?;
        let mut buf = Vec::with_capacity(len as usize);
        // Read at most what was charged, even if the file grows meanwhile.
        file.take(len)
            .read_to_end(&mut buf)
            .map_err(|e| io_err(key, e))?;
        Ok(buf)
    }

    fn get_range(
        &self,
        bucket: &str,
        key: &str,
        (offset, length): (u64, u64),
        max_object: u64,
        charge: &mut dyn FnMut(u64) -> Result<(), ObjectError>,
    ) -> Result<Vec<u8>, ObjectError> {
        let (mut file, size) = self.open(bucket, key)?;
        let length = length.min(size.saturating_sub(offset));
        if length > max_object {
            return Err(ObjectError::TooLarge(max_object));
        }
        charge(length)?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| io_err(key, e))?;
        let mut buf = Vec::with_capacity(length as usize);
        file.take(length)
            .read_to_end(&mut buf)
            .map_err(|e| io_err(key, e))?;
        Ok(buf)
    }

    fn head(&self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        let meta = self
            .bucket(bucket)?
            .metadata(key)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ObjectError::NotFound(key.to_string()),
                _ => io_err(key, e),
            })?;
        if !meta.is_file() {
            return Err(ObjectError::NotFound(key.to_string()));
        }
        Ok(ObjectMeta {
            key: key.to_string(),
            size: meta.len(),
            last_modified_ms: modified_ms(&meta),
            etag: None,
        })
    }

    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        let dir = self.bucket(bucket)?;
        // Walk from the deepest directory the prefix names.
        let (start, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let root = if start.is_empty() {
            dir
        } else {
            match dir.open_dir(start) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(io_err(start, e)),
            }
        };
        let mut out = Vec::new();
        let mut visits = 0usize;
        let mut stack = vec![(root, start.to_string())];
        while let Some((d, path)) = stack.pop() {
            for entry in d.entries().map_err(|e| io_err(&path, e))? {
                visits += 1;
                if visits > MAX_LIST_VISITS {
                    return Err(ObjectError::TooLarge(MAX_LIST_VISITS as u64));
                }
                let entry = entry.map_err(|e| io_err(&path, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let key = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}/{name}")
                };
                let ft = entry.file_type().map_err(|e| io_err(&key, e))?;
                if ft.is_dir() {
                    if key.starts_with(prefix) || prefix.starts_with(&format!("{key}/")) {
                        stack.push((d.open_dir(&name).map_err(|e| io_err(&key, e))?, key));
                    }
                } else if ft.is_file() && key.starts_with(prefix) && keep(&key) {
                    let meta = entry.metadata().map_err(|e| io_err(&key, e))?;
                    out.push(ObjectMeta {
                        key,
                        size: meta.len(),
                        last_modified_ms: modified_ms(&meta),
                        etag: None,
                    });
                }
            }
        }
        Ok(out)
    }
}

fn modified_ms(meta: &cap_std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// An S3 service, through `object_store`. Host calls are synchronous (they run on the
/// invocation's thread), so requests run on a small runtime of the backend's own.
pub struct S3 {
    settings: S3Settings,
    /// Always `Some` until dropped: [`Drop`] takes it to shut it down without blocking.
    rt: Option<tokio::runtime::Runtime>,
    clients: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl Drop for S3 {
    /// A runtime's own drop blocks on its workers and panics on an async thread, where a host
    /// may well be dropped (a test's end, a failed start in `main`); this one does neither.
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for S3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3")
            .field("endpoint", &self.settings.endpoint)
            .finish_non_exhaustive()
    }
}

fn s3_err(key: &str, e: object_store::Error) -> ObjectError {
    match e {
        object_store::Error::NotFound { .. } => ObjectError::NotFound(key.to_string()),
        e => io_err(key, e),
    }
}

impl S3 {
    pub fn new(settings: S3Settings) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hapi-s3")
            .enable_all()
            .build()?;
        Ok(Self {
            settings,
            rt: Some(rt),
            clients: Mutex::default(),
        })
    }

    fn client(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, ObjectError> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = clients.get(bucket) {
            return Ok(Arc::clone(c));
        }
        let s = &self.settings;
        let mut b = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(&s.region)
            .with_allow_http(s.endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
        if !s.endpoint.is_empty() {
            b = b.with_endpoint(&s.endpoint);
        }
        if let (Some(id), Some(secret)) = (&s.access_key_id, &s.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        let client: Arc<dyn ObjectStore> = Arc::new(
            b.build()
                .map_err(|e| ObjectError::Io(format!("bucket `{bucket}`: {e}")))?,
        );
        clients.insert(bucket.to_string(), Arc::clone(&client));
        Ok(client)
    }

    /// Runs `fut` on the backend's runtime and waits for it on this thread.
    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, ObjectError> {
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| ObjectError::Io("S3 backend shut down".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| ObjectError::Io("S3 request task failed".into()))
    }

    fn path(key: &str) -> Result<object_store::path::Path, ObjectError> {
        object_store::path::Path::parse(key)
            .map_err(|e| ObjectError::Denied(format!("`{key}`: {e}")))
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
        max_object: u64,
        charge: &mut dyn FnMut(u64) -> Result<(), ObjectError>,
    ) -> Result<Vec<u8>, ObjectError> {
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        let result = self
            .block(async move { client.get(&path).await })?
            .map_err(|e| s3_err(key, e))?;
        let size = result.meta.size;
        if size > max_object {
            return Err(ObjectError::TooLarge(max_object));
        }
        charge(size)?;
        let bytes = self
            .block(async move { result.bytes().await })?
            .map_err(|e| s3_err(key, e))?;
        Ok(bytes.to_vec())
    }

    fn get_range(
        &self,
        bucket: &str,
        key: &str,
        (offset, length): (u64, u64),
        max_object: u64,
        charge: &mut dyn FnMut(u64) -> Result<(), ObjectError>,
    ) -> Result<Vec<u8>, ObjectError> {
        let size = self.head(bucket, key)?.size;
        let length = length.min(size.saturating_sub(offset));
        if length > max_object {
            return Err(ObjectError::TooLarge(max_object));
        }
        charge(length)?;
        if length == 0 {
            return Ok(Vec::new());
        }
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        let bytes = self
            .block(async move { client.get_range(&path, offset..offset + length).await })?
            .map_err(|e| s3_err(key, e))?;
        Ok(bytes.to_vec())
    }

    fn head(&self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        let m = self
            .block(async move { client.head(&path).await })?
            .map_err(|e| s3_err(key, e))?;
        Ok(ObjectMeta {
            key: key.to_string(),
            size: m.size,
            last_modified_ms: m.last_modified.timestamp_millis().max(0) as u64,
            etag: m.e_tag,
        })
    }

    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        let client = self.client(bucket)?;
        let (dir, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let dir = if dir.is_empty() {
            None
        } else {
            Some(Self::path(dir)?)
        };
        let metas = self
            .block(async move {
                client
                    .list(dir.as_ref())
                    .take(MAX_LIST_VISITS + 1)
                    .try_collect::<Vec<_>>()
                    .await
            })?
            .map_err(|e| s3_err(prefix, e))?;
        if metas.len() > MAX_LIST_VISITS {
            return Err(ObjectError::TooLarge(MAX_LIST_VISITS as u64));
        }
        Ok(metas
            .into_iter()
            .filter(|m| {
                let k = m.location.as_ref();
                k.starts_with(prefix) && keep(k)
            })
            .map(|m| ObjectMeta {
                key: m.location.to_string(),
                size: m.size,
                last_modified_ms: m.last_modified.timestamp_millis().max(0) as u64,
                etag: m.e_tag,
            })
            .collect())
    }
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

    fn granted(&self, bucket: &str, key: &str, is_prefix: bool) -> bool {
        self.tenant.grants.iter().any(|g| {
            let p = grant_prefix(g);
            g.bucket == bucket && (key.starts_with(&p) || (is_prefix && p.starts_with(key)))
        })
    }

    /// Checks that `bucket`/`key` (or a key prefix) is a valid key within a grant.
    fn authorise(&self, bucket: &str, key: &str, is_prefix: bool) -> Result<(), ObjectError> {
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
        Ok(())
    }

    fn charger(bytes_read: &mut u64, max: u64) -> impl FnMut(u64) -> Result<(), ObjectError> + '_ {
        move |n| {
            if bytes_read.saturating_add(n) > max {
                return Err(ObjectError::TooLarge(max));
            }
            *bytes_read += n;
            Ok(())
        }
    }

    pub fn get(&mut self, bucket: &str, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.authorise(bucket, key, false)?;
        let limits = &self.tenant.limits;
        let mut charge = Self::charger(&mut self.bytes_read, limits.max_read);
        self.store.get(bucket, key, limits.max_object, &mut charge)
    }

    pub fn get_range(
        &mut self,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, ObjectError> {
        self.authorise(bucket, key, false)?;
        let limits = &self.tenant.limits;
        let mut charge = Self::charger(&mut self.bytes_read, limits.max_read);
        self.store.get_range(
            bucket,
            key,
            (offset, length),
            limits.max_object,
            &mut charge,
        )
    }

    pub fn head(&mut self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        self.authorise(bucket, key, false)?;
        self.store.head(bucket, key)
    }

    /// Objects under `prefix` within the grants, in key order, at most `limit` (and [`MAX_LIST`]).
    pub fn list(
        &mut self,
        bucket: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        self.authorise(bucket, prefix, true)?;
        let keep = |k: &str| check_key(k).is_ok() && self.granted(bucket, k, false);
        let mut out = self.store.list(bucket, prefix, &keep)?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.truncate(limit.min(MAX_LIST) as usize);
        Ok(out)
    }
}
