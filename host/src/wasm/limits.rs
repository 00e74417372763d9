//! What one invocation's store may grow to. Guest memory is charged to the invocation's
//! memory account as it grows, so guest memory and what the host holds for the guest share one
//! limit, and given back when the store goes; tables and handle tables have fixed bounds.

use crate::account::{Account, Charge};
use crate::caps::caller::Stop;
use std::sync::Arc;
use wasmtime::ResourceLimiter;

/// Largest table a guest may grow to (entries).
pub const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Most handles (resources of every kind: tensors, graphs, errors, streams...) a guest may hold
/// at once: a pushdown function needs a handful, and each costs the host memory.
pub const MAX_HANDLES: usize = 10_000;
/// Largest `get-random-bytes` answer (for tenants granted `random`).
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The store's limiter: it holds the charge for the guest's linear memory, which never
/// shrinks while the store lives and is given back with it. The last growth's charge is kept
/// apart until the next, so that a growth wasmtime fails after this approved it (past the
/// pool's slot, or no memory to map) is given back.
#[derive(Debug)]
pub struct Limiter {
    account: Arc<Account>,
    memory: Option<Charge>,
    last: Option<Charge>,
}

impl Limiter {
    pub fn new(account: Arc<Account>) -> Self {
        Self {
            account,
            memory: None,
            last: None,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current) as u64;
        if let Some(last) = self.last.take() {
            last.join(&mut self.memory);
        }
        let charge = self
            .account
            .charge(grow, "guest memory")
            .map_err(|e| Stop::from(e).trap())?;
        self.last = Some(charge);
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.last = None;
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Err(Stop::Table(format!(
                "table of {desired} elements; at most {MAX_TABLE_ELEMENTS}"
            ))
            .trap());
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_growth_is_charged_and_tables_are_bounded() {
        let account = Account::new(1 << 20);
        let mut l = Limiter::new(Arc::clone(&account));
        assert!(matches!(l.memory_growing(0, 1 << 19, None), Ok(true)));
        assert!(matches!(l.memory_growing(1 << 19, 1 << 20, None), Ok(true)));
        assert_eq!(account.used(), 1 << 20);
        let e = l
            .memory_growing(1 << 20, (1 << 20) + 65536, None)
            .expect_err("over the limit");
        assert!(e.to_string().contains("guest memory"), "{e}");
        assert!(matches!(
            l.table_growing(0, MAX_TABLE_ELEMENTS, None),
            Ok(true)
        ));
        let e = l
            .table_growing(0, MAX_TABLE_ELEMENTS + 1, None)
            .expect_err("over the table bound");
        assert!(
            matches!(e.downcast_ref::<Stop>(), Some(Stop::Table(_))),
            "{e}"
        );
        assert_eq!(account.used(), 1 << 20, "a refused growth charges nothing");
        drop(l);
        assert_eq!(
            account.used(),
            0,
            "the store's memory is given back with it"
        );
        assert_eq!(account.peak(), 1 << 20);
        // A growth approved here, then failed by wasmtime, is given back; the one before stays.
        let mut l = Limiter::new(Arc::clone(&account));
        assert!(matches!(l.memory_growing(0, 1 << 19, None), Ok(true)));
        assert!(matches!(l.memory_growing(1 << 19, 1 << 20, None), Ok(true)));
        l.memory_grow_failed(wasmtime::format_err!("no memory to map"))
            .expect("noted");
        assert_eq!(account.used(), 1 << 19);
        assert!(matches!(l.memory_growing(1 << 19, 1 << 20, None), Ok(true)));
        assert_eq!(account.used(), 1 << 20);
        drop(l);
        assert_eq!(account.used(), 0);
    }
}
