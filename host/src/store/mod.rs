//! Where objects live, and a tenant's scoped view of them.
//!
//! Two backends do the I/O and behave the same (one conformance suite runs on both):
//!
//! - [`local`] (the default): a directory whose subdirectories are buckets, opened once with
//!   cap-std; every access goes through that handle, so no key can reach outside it;
//! - [`s3`]: any S3 service through `object_store`; beside a SeaweedFS volume server,
//!   [`locality`] reads the replicas it holds from it instead of through the gateway.
//!
//! A tenant never reaches a backend directly: [`scoped::Scoped`] checks keys, grants and byte
//! caps once, for every backend, before any I/O (as object_store's `PrefixStore` and
//! `LimitStore` wrap a store).

pub mod error;
pub mod keys;
pub mod local;
pub mod locality;
pub mod s3;
pub mod scoped;

pub use error::{ObjectError, ObjectMeta};

use crate::account::{Account, Paced};
use crate::policy::StoreLocation;
use std::sync::Arc;

/// Most entries one `list` call returns.
pub const MAX_LIST: u32 = 10_000;
/// Most entries one `list` call visits, so a huge bucket cannot stall the host.
pub const MAX_LIST_VISITS: usize = 200_000;

/// The object store the host reads from.
#[derive(Debug)]
pub enum Store {
    Local(local::Local),
    S3(Box<s3::S3>),
}

impl Store {
    pub fn open(location: &StoreLocation) -> anyhow::Result<Self> {
        Ok(match location {
            StoreLocation::Local(path) => Store::Local(local::Local::open(path)?),
            StoreLocation::S3(settings) => Store::S3(Box::new(s3::S3::new(settings.clone()))),
        })
    }

    /// Reading replicas from the local volume server, when the policy sets it up.
    pub fn locality(&self) -> Option<&locality::Locality> {
        match self {
            Store::Local(_) => None,
            Store::S3(s) => s.locality(),
        }
    }

    /// Whether a call's work is done on this host's threads (the local store's file system
    /// calls) rather than mostly waiting on another machine (S3).
    pub fn works_here(&self) -> bool {
        matches!(self, Store::Local(_))
    }

    /// The object's size, without its bytes (to check caps before reading).
    pub async fn head(
        &self,
        bucket: &str,
        key: &str,
        pace: Paced<'_>,
    ) -> Result<ObjectMeta, ObjectError> {
        match self {
            Store::Local(l) => l.head(bucket, key, pace).await,
            Store::S3(s) => s.head(bucket, key).await,
        }
    }

    /// Bytes [offset, offset + length) of the object, which the caller has checked exist
    /// (`head`) and has charged for; a shorter read if the object shrank meanwhile.
    pub async fn read(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
        pace: Paced<'_>,
    ) -> Result<Vec<u8>, ObjectError> {
        match self {
            Store::Local(l) => l.read(bucket, key, offset, length, pace).await,
            Store::S3(s) => s.read(tenant, bucket, key, offset, length).await,
        }
    }

    /// At most `limit` objects whose keys start with `prefix` and pass `keep`, in key order,
    /// after visiting at most `visits` entries (else `TooManyEntries(visits)`); what the
    /// listing holds meanwhile is charged to `account` (past its limit: `OverLimit`).
    pub async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        limit: usize,
        visits: usize,
        keep: Arc<dyn Fn(&str) -> bool + Send + Sync>,
        (pace, account): (Paced<'_>, Option<&Arc<Account>>),
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        match self {
            Store::Local(l) => {
                l.list(bucket, prefix, limit, visits, keep, (pace, account))
                    .await
            }
            Store::S3(s) => s.list(bucket, prefix, limit, visits, keep, account).await,
        }
    }
}
