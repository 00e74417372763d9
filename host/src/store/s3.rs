//! An S3 service, through `object_store`, one client per bucket.

use super::error::{ObjectError, ObjectMeta, Smallest};
use crate::account::Account;
use crate::account::text::quote;
use crate::policy::S3Settings;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

pub struct S3 {
    settings: S3Settings,
    clients: Mutex<HashMap<String, Arc<AmazonS3>>>,
    locality: Option<super::locality::Locality>,
}

impl std::fmt::Debug for S3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3")
            .field("endpoint", &self.settings.endpoint)
            .finish_non_exhaustive()
    }
}

fn map(key: &str, e: object_store::Error) -> ObjectError {
    match e {
        object_store::Error::NotFound { .. } => ObjectError::NotFound(quote(key)),
        object_store::Error::InvalidPath { .. } => ObjectError::Denied(quote(key)),
        e => ObjectError::Io(format!("{}: {e}", quote(key))),
    }
}

fn meta(m: object_store::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        key: m.location.to_string(),
        size: m.size,
        last_modified_ms: m.last_modified.timestamp_millis().max(0) as u64,
        etag: m.e_tag,
    }
}

impl S3 {
    pub fn new(settings: S3Settings) -> Self {
        Self {
            locality: settings
                .locality
                .clone()
                .map(super::locality::Locality::new),
            settings,
            clients: Mutex::default(),
        }
    }

    /// Reading replicas from the local volume server, when the policy sets it up.
    pub fn locality(&self) -> Option<&super::locality::Locality> {
        self.locality.as_ref()
    }

    fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>, ObjectError> {
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
        let client = Arc::new(
            b.build()
                .map_err(|e| ObjectError::Io(format!("bucket `{}`: {e}", quote(bucket))))?,
        );
        clients.insert(bucket.to_string(), Arc::clone(&client));
        Ok(client)
    }

    fn path(key: &str) -> Result<object_store::path::Path, ObjectError> {
        object_store::path::Path::parse(key)
            .map_err(|e| ObjectError::Denied(format!("`{}`: {e}", quote(key))))
    }

    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        let m = client.head(&path).await.map_err(|e| map(key, e))?;
        Ok(ObjectMeta {
            key: key.to_string(),
            ..meta(m)
        })
    }

    /// Bytes of an object, for `tenant` (whose share of the filer lookups a local read uses).
    pub async fn read(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, ObjectError> {
        let Some(end) = offset.checked_add(length).filter(|_| length > 0) else {
            return Ok(Vec::new());
        };
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        if let Some(near) = &self.locality
            && let Some(bytes) = near.read(tenant, bucket, key, offset, length).await
        {
            return Ok(bytes);
        }
        match client.get_range(&path, offset..end).await {
            Ok(bytes) => {
                // A store that sends more than was asked for is cut to what was charged.
                let n = bytes
                    .len()
                    .min(usize::try_from(length).unwrap_or(usize::MAX));
                // Without a second copy: the buffer object_store filled is the one returned
                // when nothing else holds it (it copies otherwise).
                let mut bytes = Vec::from(bytes);
                bytes.truncate(n);
                Ok(bytes)
            }
            Err(e) => Err(map(key, e)),
        }
    }

    pub async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        limit: usize,
        max_visits: usize,
        keep: Arc<dyn Fn(&str) -> bool + Send + Sync>,
        account: Option<&Arc<Account>>,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        let client = self.client(bucket)?;
        // The keys that start with the prefix as written, a page at a time. Listed as a
        // directory (what `ObjectStore::list` takes), `train/n014` walked every object under
        // `train/`, where the local store walks only the entries that match: a prefix ending
        // partway through a name under a large directory was refused as too many entries on
        // S3 and answered on the local store, and made the filer enumerate the whole
        // directory for a few keys.
        let prefix_asked = (!prefix.is_empty()).then_some(prefix);
        let mut kept = Smallest::new(limit, account);
        let mut visits = 0usize;
        let mut page_token = None;
        loop {
            let options = PaginatedListOptions {
                page_token: page_token.take(),
                ..PaginatedListOptions::default()
            };
            let page = client
                .list_paginated(prefix_asked, options)
                .await
                .map_err(|e| map(prefix, e))?;
            for m in page.result.objects {
                visits += 1;
                if visits > max_visits {
                    return Err(ObjectError::TooManyEntries(max_visits as u64));
                }
                let k = m.location.as_ref();
                if k.starts_with(prefix) && keep(k) {
                    kept.push(meta(m))?;
                }
            }
            match page.page_token {
                Some(next) => page_token = Some(next),
                None => break,
            }
        }
        Ok(kept.into_sorted())
    }
}
