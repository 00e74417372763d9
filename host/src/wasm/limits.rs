//! What one invocation's store may grow to. Guest memory is charged to the invocation's
//! memory account as it grows, so guest memory and what the host holds for the guest share one
//! limit, and given back when the store goes; so are its tables' entries, which also have a
//! fixed bound, as handle tables do.

use crate::account::{Account, Charge};
use crate::caps::caller::Stop;
use std::sync::Arc;
use wasmtime::ResourceLimiter;

/// Largest table a guest may grow to (entries): the pool's bound (`engine.rs`), which this
/// limiter enforces with `table_limit_exceeded` rather than the pool's -1 to the guest.
pub use super::engine::MAX_TABLE_ELEMENTS;
/// What a table entry takes of the host's memory (a pointer), charged as tables grow.
pub const TABLE_ENTRY_BYTES: u64 = 8;
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
    tables: Option<Charge>,
    last_table: Option<Charge>,
}

impl Limiter {
    pub fn new(account: Arc<Account>) -> Self {
        Self {
            account,
            memory: None,
            last: None,
            tables: None,
            last_table: None,
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
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Err(Stop::Table(format!(
                "table of {desired} elements; at most {MAX_TABLE_ELEMENTS}"
            ))
            .trap());
        }
        if let Some(last) = self.last_table.take() {
            last.join(&mut self.tables);
        }
        let grow = desired.saturating_sub(current) as u64 * TABLE_ENTRY_BYTES;
        let charge = self
            .account
            .charge(grow, "guest tables")
            .map_err(|e| Stop::from(e).trap())?;
        self.last_table = Some(charge);
        Ok(true)
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.last_table = None;
        Ok(())
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
        let e = l
            .table_growing(0, MAX_TABLE_ELEMENTS + 1, None)
            .expect_err("over the table bound");
        assert!(
            matches!(e.downcast_ref::<Stop>(), Some(Stop::Table(_))),
            "{e}"
        );
        assert_eq!(account.used(), 1 << 20, "a refused growth charges nothing");
        // The memory limit is reached: a table's entries are charged with it.
        let e = l
            .table_growing(0, 1, None)
            .expect_err("over the memory limit");
        assert!(e.to_string().contains("guest tables"), "{e}");
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

    #[test]
    fn table_entries_are_charged_until_the_store_goes() {
        let account = Account::new(1 << 20);
        let mut l = Limiter::new(Arc::clone(&account));
        assert!(matches!(l.table_growing(0, 1000, None), Ok(true)));
        assert!(matches!(
            l.table_growing(1000, MAX_TABLE_ELEMENTS, None),
            Ok(true)
        ));
        let all = MAX_TABLE_ELEMENTS as u64 * TABLE_ENTRY_BYTES;
        assert_eq!(account.used(), all);
        // A second table; its growth failed by wasmtime is given back.
        assert!(matches!(l.table_growing(0, 10, None), Ok(true)));
        l.table_grow_failed(wasmtime::format_err!("past the pool's slot"))
            .expect("noted");
        assert_eq!(account.used(), all);
        drop(l);
        assert_eq!(account.used(), 0);
    }
}
