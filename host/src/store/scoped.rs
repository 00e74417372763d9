//! A tenant's view of the store: keys checked, grants enforced and byte caps charged once here,
//! for every backend, before any I/O.

use super::error::{Held, LISTING_ENTRIES, META_SLOT, ObjectError, ObjectMeta};
use super::keys::{check_key, check_prefix};
use super::{MAX_LIST, MAX_LIST_VISITS, Store};
use crate::account::text::quote;
use crate::account::{Account, Pace};
use crate::policy::Tenant;
use std::sync::Arc;

/// A read that passed every check and was charged to the invocation's read cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub bucket: String,
    pub key: String,
    pub offset: u64,
    pub length: u64,
}

/// One invocation's view of the objects: its tenant's grants and its byte budget.
#[derive(Debug)]
pub struct Scoped {
    /// The tenant as the invocation was admitted: its name and limits.
    tenant: Arc<Tenant>,
    /// The tenant whose grants apply: the same, or as a reload since has it ([`Scoped::regrant`]).
    grants: Arc<Tenant>,
    store: Arc<Store>,
    /// Who the local store's work for these calls is charged to.
    pace: Option<Arc<dyn Pace>>,
    /// Whose memory what a listing holds while it is built is charged to.
    account: Option<Arc<Account>>,
    /// Bytes read (charged) so far by this invocation.
    pub bytes_read: u64,
}

/// Whether `tenant` may read `bucket`/`key` (or, with `is_prefix`, list under it).
pub fn granted(tenant: &Tenant, bucket: &str, key: &str, is_prefix: bool) -> bool {
    tenant.grants.iter().any(|g| {
        let p = g.dir();
        g.bucket == bucket && (key.starts_with(&p) || (is_prefix && p.starts_with(key)))
    })
}

impl Scoped {
    pub fn new(tenant: Arc<Tenant>, store: Arc<Store>) -> Self {
        Self {
            grants: Arc::clone(&tenant),
            tenant,
            store,
            pace: None,
            account: None,
            bytes_read: 0,
        }
    }

    /// The same view, with the store's own work for its calls charged to `pace` (an
    /// invocation's turn on the workers).
    pub fn paced(self, pace: Arc<dyn Pace>) -> Self {
        Self {
            pace: Some(pace),
            ..self
        }
    }

    /// The same view, with what a listing holds while it is built charged to `account` (an
    /// invocation's).
    pub fn charged_to(self, account: Arc<Account>) -> Self {
        Self {
            account: Some(account),
            ..self
        }
    }

    /// The grants of `now` (the tenant as a reloaded policy has it) apply from the next call on;
    /// the limits stay the invocation's.
    pub fn regrant(&mut self, now: Arc<Tenant>) {
        self.grants = now;
    }

    /// Whether the store's work for a call is done on this host's threads (see
    /// [`Store::works_here`]).
    pub fn works_here(&self) -> bool {
        self.store.works_here()
    }

    /// Checks that `bucket`/`key` (or a key prefix) is a valid key within a grant.
    fn authorise(&self, bucket: &str, key: &str, is_prefix: bool) -> Result<(), ObjectError> {
        if is_prefix {
            check_prefix(key)
        } else {
            check_key(key)
        }
        .map_err(ObjectError::Denied)?;
        if !granted(&self.grants, bucket, key, is_prefix) {
            return Err(ObjectError::Denied(format!(
                "`{}/{}` is outside tenant `{}`'s grants",
                quote(bucket),
                quote(key),
                self.tenant.name
            )));
        }
        Ok(())
    }

    /// Authorises a read of the whole object (`range` None) or of bytes [offset, offset +
    /// length) (shorter at its end, empty past it), checks the object and read caps, and charges
    /// the read cap.
    pub async fn plan(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Read, ObjectError> {
        self.authorise(bucket, key, false)?;
        let size = self.store.head(bucket, key, self.pace.as_ref()).await?.size;
        let (offset, length) = match range {
            None => (0, size),
            Some((offset, length)) => (offset, length.min(size.saturating_sub(offset))),
        };
        let limits = &self.tenant.limits;
        if length > limits.max_object {
            return Err(ObjectError::TooLarge(limits.max_object));
        }
        if self.bytes_read.saturating_add(length) > limits.max_read {
            return Err(ObjectError::TooLarge(limits.max_read));
        }
        self.bytes_read += length;
        Ok(Read {
            bucket: bucket.to_string(),
            key: key.to_string(),
            offset,
            length,
        })
    }

    /// Performs a planned read.
    pub async fn read(&self, r: &Read) -> Result<Vec<u8>, ObjectError> {
        if r.length == 0 {
            return Ok(Vec::new());
        }
        self.store
            .read(
                &self.tenant.name,
                &r.bucket,
                &r.key,
                r.offset,
                r.length,
                self.pace.as_ref(),
            )
            .await
    }

    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        self.authorise(bucket, key, false)?;
        self.store.head(bucket, key, self.pace.as_ref()).await
    }

    /// Objects under `prefix` within the grants, in key order, at most `limit` (and
    /// [`MAX_LIST`]), after visiting at most [`MAX_LIST_VISITS`] entries.
    pub async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        self.list_within(bucket, prefix, limit, MAX_LIST_VISITS)
            .await
    }

    /// [`Scoped::list`] with another bound on the entries visited.
    pub async fn list_within(
        &self,
        bucket: &str,
        prefix: &str,
        limit: u32,
        visits: usize,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        self.authorise(bucket, prefix, true)?;
        let (tenant, b) = (Arc::clone(&self.grants), bucket.to_string());
        let keep: Arc<dyn Fn(&str) -> bool + Send + Sync> =
            Arc::new(move |k: &str| check_key(k).is_ok() && granted(&tenant, &b, k, false));
        let limit = limit.min(MAX_LIST) as usize;
        let walks = self.walks(bucket, prefix);
        // The visits are shared by the walks: a listing visits at most `visits` entries.
        let each = visits.div_ceil(walks.len().max(1));
        let mut listed: Vec<ObjectMeta> = Vec::new();
        // What the earlier walks found is held while the next walk runs: charged as the walk's
        // own entries were while it ran.
        let mut held = Held::new(self.account.as_ref(), LISTING_ENTRIES);
        for walk in &walks {
            let found = self.store.list(
                bucket,
                walk,
                limit,
                each,
                Arc::clone(&keep),
                (self.pace.as_ref(), self.account.as_ref()),
            );
            // Past its part of the bound, the listing is past the bound.
            let found = found.await.map_err(|e| match e {
                ObjectError::TooManyEntries(_) => ObjectError::TooManyEntries(visits as u64),
                other => other,
            })?;
            // The walk's entries are the listing's now: their strings, and its vector, which
            // is the listing's if it is the first to find any, or else is held until its
            // entries are moved into the listing's (grown to hold them first).
            let slots = found.capacity();
            let strings: u64 = found.iter().map(ObjectMeta::heap_bytes).sum();
            held.grow((slots * META_SLOT) as u64 + strings)?;
            if listed.is_empty() {
                let old = std::mem::replace(&mut listed, found).capacity();
                held.shrink((old * META_SLOT) as u64);
            } else {
                let (len, need) = (listed.len(), listed.len() + found.len());
                if need > listed.capacity() {
                    let old = listed.capacity();
                    let into = &mut listed;
                    held.regrow(META_SLOT, (old, need), || {
                        into.reserve_exact(need - len);
                        into.capacity()
                    })?;
                }
                listed.extend(found);
                held.shrink((slots * META_SLOT) as u64);
            }
            // The smallest `limit` after each walk: never more than twice `limit` held, however
            // many grants the prefix covers. Sorted in place (a stable sort takes a buffer as
            // long as the listing, uncharged); the walks' keys are distinct, none inside
            // another's prefix.
            listed.sort_unstable_by(|a, b| a.key.cmp(&b.key));
            held.shrink(listed.iter().skip(limit).map(ObjectMeta::heap_bytes).sum());
            listed.truncate(limit);
        }
        Ok(listed)
    }

    /// The prefixes a listing of `prefix` walks: `prefix` itself if a grant holds it, else the
    /// grants under it (a listing of a grant's parent walks the grants, not their neighbours:
    /// `""` does not walk the whole bucket, other tenants' data included), none inside another.
    fn walks(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let mut walks = Vec::new();
        for g in self.grants.grants.iter().filter(|g| g.bucket == bucket) {
            let p = g.dir();
            if prefix.starts_with(&p) {
                return vec![prefix.to_string()];
            }
            if p.starts_with(prefix) {
                walks.push(p);
            }
        }
        // Sorted, a prefix inside another comes after it.
        walks.sort();
        walks.dedup_by(|inner, outer| inner.starts_with(outer.as_str()));
        walks
    }
}
