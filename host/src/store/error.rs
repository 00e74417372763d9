//! What object operations return and how they fail (mirrors the WIT `object-error`).

use crate::account::{Account, Charge, OverLimit};
use std::sync::Arc;

/// Why an object operation failed.
///
/// `NotFound`, `Denied`, `TooLarge` and `TooManyEntries` are the caller's (4xx); `Io` is the
/// store's own failure, the only one the host answers with a 5xx.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("too large: over the cap of {0} bytes")]
    TooLarge(u64),
    /// A listing that would visit more entries than its bound (carries the bound).
    #[error("too many entries: a listing visits at most {0}")]
    TooManyEntries(u64),
    #[error("i/o: {0}")]
    Io(String),
    /// The store's job for a caller stopped on the caller's account, not the store's: the
    /// caller went away, or its time was up (the local store's jobs).
    #[error("stopped: {0}")]
    Stopped(String),
    /// What the job holds for its caller (a listing's entries, a walk's directories to come)
    /// went over the caller's memory limit.
    #[error("{0}")]
    OverLimit(OverLimit),
}

/// What a store's job holds for its caller, charged to the caller's account as it grows and
/// released as it shrinks (no account: nothing charged; tests and tools).
#[derive(Debug)]
pub struct Held {
    account: Option<Arc<Account>>,
    charge: Option<Charge>,
    what: &'static str,
}

impl Held {
    pub fn new(account: Option<&Arc<Account>>, what: &'static str) -> Self {
        Self {
            account: account.map(Arc::clone),
            charge: None,
            what,
        }
    }

    /// Charges `bytes` more, or refuses if that goes over the caller's limit.
    pub fn grow(&mut self, bytes: u64) -> Result<(), ObjectError> {
        let Some(account) = &self.account else {
            return Ok(());
        };
        account
            .charge(bytes, self.what)
            .map_err(ObjectError::OverLimit)?
            .join(&mut self.charge);
        Ok(())
    }

    /// Releases `bytes` of what was charged.
    pub fn shrink(&mut self, bytes: u64) {
        if let Some(held) = &mut self.charge {
            drop(held.split(bytes.min(held.bytes())));
        }
    }

    /// Moves a buffer of `slot`-byte elements from room for `old` to room for `new`, charged
    /// as the allocator holds it: the new buffer whole before it is taken and beside the old
    /// one until that is freed, then the old one released. `reserve` makes the room and
    /// returns the room it was given, charged too where it is more than `new`.
    pub fn regrow(
        &mut self,
        slot: usize,
        (old, new): (usize, usize),
        reserve: impl FnOnce() -> usize,
    ) -> Result<(), ObjectError> {
        self.grow((new * slot) as u64)?;
        let given = reserve();
        self.shrink((old * slot) as u64);
        self.grow((given.saturating_sub(new) * slot) as u64)
    }
}

/// What a listing's kept entries are charged as.
pub const LISTING_ENTRIES: &str = "a listing's entries, held by the host";

/// Bytes a string holds on the heap and in place.
pub fn string_bytes(s: &str) -> u64 {
    (s.len() + size_of::<String>()) as u64
}

/// Bytes the allocator takes for a heap block of `n` bytes (glibc's malloc: an 8-byte header,
/// 16-byte alignment, 32 bytes at least); none for an empty one, which is not allocated.
pub fn heap_block(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        (n + 8).next_multiple_of(16).max(32) as u64
    }
}

/// Bytes an [`ObjectMeta`] takes in place, in its vector's slot.
pub const META_SLOT: usize = size_of::<ObjectMeta>();

/// What `head` and `list` return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    pub last_modified_ms: u64,
    pub etag: Option<String>,
}

impl ObjectMeta {
    /// Bytes this entry takes once copied into a guest (strings and fixed fields).
    pub fn guest_bytes(&self) -> u64 {
        (self.key.len() + self.etag.as_ref().map_or(0, String::len) + 40) as u64
    }

    /// Bytes this entry's strings take on the host's heap (its slot is its vector's,
    /// [`META_SLOT`]): a listing the host holds is charged as the host holds it, some twice
    /// what the guest's copy takes for short keys.
    pub fn heap_bytes(&self) -> u64 {
        heap_block(self.key.capacity()) + self.etag.as_ref().map_or(0, |e| heap_block(e.capacity()))
    }
}

/// Keeps the `limit` smallest keys seen, so that listing a huge prefix holds `limit` entries,
/// not every entry visited; what it holds is charged to the caller ([`Held`]): the entries'
/// strings and its vector's room, which grows as a vector's does, up to `limit`.
#[derive(Debug)]
pub struct Smallest {
    limit: usize,
    heap: std::collections::BinaryHeap<Entry>,
    held: Held,
}

#[derive(Debug)]
struct Entry(ObjectMeta);

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.0.key == o.0.key
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&o.0.key)
    }
}

impl Smallest {
    pub fn new(limit: usize, account: Option<&Arc<Account>>) -> Self {
        Self {
            limit,
            heap: std::collections::BinaryHeap::new(),
            held: Held::new(account, LISTING_ENTRIES),
        }
    }

    /// Keeps `m` if it is among the `limit` smallest so far, charged before it is kept.
    pub fn push(&mut self, m: ObjectMeta) -> Result<(), ObjectError> {
        if self.limit == 0 {
            return Ok(());
        }
        if self.heap.len() < self.limit {
            self.room()?;
            self.held.grow(m.heap_bytes())?;
            self.heap.push(Entry(m));
        } else if self.heap.peek().is_some_and(|top| m.key < top.0.key) {
            // The one it replaces goes first (past the limit the listing fails whole).
            if let Some(out) = self.heap.pop() {
                self.held.shrink(out.0.heap_bytes());
            }
            self.held.grow(m.heap_bytes())?;
            self.heap.push(Entry(m));
        }
        Ok(())
    }

    /// Room for one more entry: full, the vector doubles (4 at first, `limit` at most),
    /// charged before it grows.
    fn room(&mut self) -> Result<(), ObjectError> {
        let (len, old) = (self.heap.len(), self.heap.capacity());
        if len < old {
            return Ok(());
        }
        let new = old.max(4).min(self.limit - len) + old;
        let heap = &mut self.heap;
        self.held.regrow(META_SLOT, (old, new), || {
            heap.reserve_exact(new - len);
            heap.capacity()
        })
    }

    /// The kept entries in key order.
    pub fn into_sorted(mut self) -> Vec<ObjectMeta> {
        self.take_sorted()
    }

    /// The kept entries in key order, taken out (their charge given back when `self` goes).
    pub fn take_sorted(&mut self) -> Vec<ObjectMeta> {
        std::mem::take(&mut self.heap)
            .into_sorted_vec()
            .into_iter()
            .map(|e| e.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str) -> ObjectMeta {
        ObjectMeta {
            key: key.into(),
            size: 0,
            last_modified_ms: 0,
            etag: None,
        }
    }

    #[test]
    fn the_smallest_keys_are_kept_in_order() {
        let mut s = Smallest::new(3, None);
        for k in ["e", "a", "d", "b", "c", "a0"] {
            s.push(meta(k)).expect("nothing charged");
        }
        let keys: Vec<String> = s.into_sorted().into_iter().map(|m| m.key).collect();
        assert_eq!(keys, ["a", "a0", "b"]);
        let mut none = Smallest::new(0, None);
        none.push(meta("a")).expect("nothing charged");
        assert!(none.into_sorted().is_empty());
    }

    #[test]
    fn what_a_listing_holds_is_charged_while_held() {
        let account = Account::new(1000);
        let mut s = Smallest::new(2, Some(&account));
        let long = "k".repeat(300);
        for k in [format!("b{long}"), format!("c{long}"), format!("a{long}")] {
            s.push(meta(&k)).expect("within the limit");
        }
        // Two kept (the third pushed out the largest): two entries' strings held, and the
        // room for two.
        let entry = meta(&format!("a{long}")).heap_bytes();
        assert_eq!(entry, 320, "a key of 301 bytes in a block of 320");
        assert_eq!(account.used(), 2 * entry + 2 * META_SLOT as u64);
        let refused = s.push(meta(&"0".repeat(700)));
        assert!(
            matches!(refused, Err(ObjectError::OverLimit(_))),
            "{refused:?}"
        );
        // A listing past the limit fails whole; what it held is released with it.
        drop(s);
        assert_eq!(account.used(), 0, "released with the listing");
    }
}
