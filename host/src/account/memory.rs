//! An invocation's memory account: its guest's linear memory and everything the host holds for
//! it (tensors with their dimensions, error values, resource handles, object reads on their way
//! into the guest, compute inputs and outputs, pooled slices) count against one limit, the
//! tenant's `memory`.
//!
//! A [`Charge`] is taken before the bytes it stands for are allocated and travels with them
//! (into a resource, a device call, a pooled batch); dropping it gives the bytes back. Linear
//! memory is charged as it grows (it never shrinks) into one charge the store's limiter holds,
//! given back when the store goes.
//!
//! What this bounds: while an invocation runs, the host holds at most `limit` bytes for it,
//! plus the one value being copied in or out of the guest by the host call in progress (at
//! most `limit` more, since a value in flight is checked against what is left, and wasmtime
//! lifts at most `limit` bytes of a host call's arguments, its hostcall fuel, even from lists
//! that all point at one buffer).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the host spends on a resource handle itself, whatever it holds (table entry, box,
/// bookkeeping): charged for every handle so that millions of empty ones are not free.
pub const HANDLE_BYTES: u64 = 128;

/// One invocation's memory.
#[derive(Debug)]
pub struct Account {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

/// Why a charge was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what}: {need} more bytes would take the invocation to {total} bytes, over its memory limit of {limit}"
)]
pub struct OverLimit {
    pub what: &'static str,
    pub need: u64,
    pub total: u64,
    pub limit: u64,
}

impl Account {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The most ever charged at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// `used + bytes`, if that stays within the limit.
    fn within(&self, used: u64, bytes: u64, what: &'static str) -> Result<u64, OverLimit> {
        let total = used.saturating_add(bytes);
        if total > self.limit {
            return Err(OverLimit {
                what,
                need: bytes,
                total,
                limit: self.limit,
            });
        }
        Ok(total)
    }

    /// Adds `bytes` if the total stays within the limit.
    fn add(&self, bytes: u64, what: &'static str) -> Result<(), OverLimit> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let total = self.within(used, bytes, what)?;
            match self
                .used
                .compare_exchange_weak(used, total, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.peak.fetch_max(total, Ordering::AcqRel);
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }

    fn sub(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Charges `bytes` for `what` until the returned guard is dropped.
    pub fn charge(self: &Arc<Self>, bytes: u64, what: &'static str) -> Result<Charge, OverLimit> {
        self.add(bytes, what)?;
        Ok(Charge {
            account: Arc::clone(self),
            bytes,
        })
    }

    /// Checks that a value of `bytes` on its way into the guest could fit beside what is held:
    /// the guest must hold it in its own memory afterwards, so a value larger than what is
    /// left can never be delivered, and is refused before the host allocates it.
    pub fn check_incoming(&self, bytes: u64, what: &'static str) -> Result<(), OverLimit> {
        self.within(self.used(), bytes, what).map(drop)
    }
}

/// Bytes charged to an account until dropped.
#[derive(Debug)]
pub struct Charge {
    account: Arc<Account>,
    bytes: u64,
}

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// One charge holding both, released together (`other` must be of the same account;
    /// one of another account is released at once).
    pub fn absorb(mut self, mut other: Charge) -> Charge {
        if Arc::ptr_eq(&self.account, &other.account) {
            self.bytes += std::mem::take(&mut other.bytes);
        }
        self
    }

    /// Adds this charge to `held`, which takes it whole if it held none (a value charged as it
    /// grows).
    pub fn join(self, held: &mut Option<Charge>) {
        *held = Some(match held.take() {
            Some(h) => h.absorb(self),
            None => self,
        });
    }

    /// Takes `bytes` of this charge into a charge of its own (for a part of a value that goes
    /// its own way); fails if this charge holds fewer.
    pub fn split(&mut self, bytes: u64) -> Option<Charge> {
        self.bytes = self.bytes.checked_sub(bytes)?;
        Some(Charge {
            account: Arc::clone(&self.account),
            bytes,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.account.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_refused_past_the_limit_and_given_back_on_drop() {
        let a = Account::new(100);
        let c1 = a.charge(60, "t").expect("fits");
        let e = a.charge(41, "tensor").expect_err("over");
        assert_eq!((e.need, e.total, e.limit), (41, 101, 100));
        assert!(e.to_string().contains("tensor"), "{e}");
        let c2 = a.charge(40, "t").expect("exactly the limit");
        assert_eq!(a.used(), 100);
        drop(c1);
        assert_eq!(a.used(), 40);
        let _c3 = a.charge(50, "linear memory").expect("fits");
        assert!(a.charge(11, "linear memory").is_err());
        drop(c2);
        assert_eq!(a.used(), 50);
        assert_eq!(a.peak(), 100);
    }

    #[test]
    fn incoming_values_must_fit_beside_what_is_held() {
        let a = Account::new(100);
        let _held = a.charge(70, "t").expect("fits");
        assert!(a.check_incoming(30, "object").is_ok());
        assert!(a.check_incoming(31, "object").is_err());
        assert_eq!(a.used(), 70, "a check charges nothing");
    }

    #[test]
    fn a_charge_splits_into_parts_that_release_separately() {
        let a = Account::new(100);
        let mut whole = a.charge(90, "t").expect("fits");
        let part = whole.split(30).expect("part");
        assert!(whole.split(61).is_none());
        drop(whole);
        assert_eq!(a.used(), 30);
        drop(part);
        assert_eq!(a.used(), 0);
    }
}
