//! What object operations return and how they fail (mirrors the WIT `object-error`).

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
}

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
}

/// Keeps the `limit` smallest keys seen, so that listing a huge prefix holds `limit` entries,
/// not every entry visited.
#[derive(Debug)]
pub struct Smallest {
    limit: usize,
    heap: std::collections::BinaryHeap<Entry>,
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
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            heap: std::collections::BinaryHeap::new(),
        }
    }

    pub fn push(&mut self, m: ObjectMeta) {
        if self.limit == 0 {
            return;
        }
        if self.heap.len() < self.limit {
            self.heap.push(Entry(m));
        } else if self.heap.peek().is_some_and(|top| m.key < top.0.key) {
            self.heap.pop();
            self.heap.push(Entry(m));
        }
    }

    /// The kept entries in key order.
    pub fn into_sorted(self) -> Vec<ObjectMeta> {
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|e| e.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_keys_are_kept_in_order() {
        let mut s = Smallest::new(3);
        for k in ["e", "a", "d", "b", "c", "a0"] {
            s.push(ObjectMeta {
                key: k.into(),
                size: 0,
                last_modified_ms: 0,
                etag: None,
            });
        }
        let keys: Vec<String> = s.into_sorted().into_iter().map(|m| m.key).collect();
        assert_eq!(keys, ["a", "a0", "b"]);
        let mut none = Smallest::new(0);
        none.push(ObjectMeta {
            key: "a".into(),
            size: 0,
            last_modified_ms: 0,
            etag: None,
        });
        assert!(none.into_sorted().is_empty());
    }
}
