//! `wasi:io/poll` with a bound on the list a guest polls. Every component built with Rust's std
//! imports it, and wasmtime-wasi's `poll` does work and allocates for every entry of the list,
//! repeats of one pollable included, in one step that never yields: a list of millions of
//! copies of one pollable would hold an invocation worker for as long. No more than
//! [`MAX_HANDLES`] pollables can exist in a store at once, so a longer list is refused. The
//! list is lifted before this sees it: that is wasmtime's work, bounded by the store's hostcall
//! fuel (the tenant's memory limit), and it does not yield either.

use super::cpu::Turn;
use super::limits::MAX_HANDLES;
use wasmtime::component::{HasData, Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::io::poll;

/// The store's handle table, seen through the bounded `poll`; the invocation's run slot is
/// given back while the guest blocks.
#[derive(Debug)]
pub struct Bounded<'a> {
    pub table: &'a mut ResourceTable,
    pub turn: &'a Turn,
    /// The invocation's time limit: a wait past its deadline stops it there
    /// ([`Turn::off_within`]).
    pub limit: std::time::Duration,
}

/// The invocation's stop at its time limit, in `wasi:io/poll`.
fn out_of_time(limit: std::time::Duration) -> wasmtime::Error {
    crate::caps::caller::Stop::Time {
        limit,
        during: "in wasi:io/poll",
    }
    .trap()
}

/// Links [`Bounded`] (`add_to_linker::<State, HasBounded>`).
#[derive(Debug)]
pub struct HasBounded;

impl HasData for HasBounded {
    type Data<'a> = Bounded<'a>;
}

impl poll::Host for Bounded<'_> {
    async fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        if pollables.len() > MAX_HANDLES {
            return Err(wasmtime::format_err!(
                "wasi:io/poll of {} pollables; at most {MAX_HANDLES} (no more can exist at once)",
                pollables.len()
            ));
        }
        let (turn, limit) = (self.turn, self.limit);
        turn.off_within(poll::Host::poll(&mut *self.table, pollables))
            .await
            .unwrap_or_else(|| Err(out_of_time(limit)))
    }
}

impl poll::HostPollable for Bounded<'_> {
    async fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        let (turn, limit) = (self.turn, self.limit);
        turn.off_within(poll::HostPollable::block(&mut *self.table, pollable))
            .await
            .unwrap_or_else(|| Err(out_of_time(limit)))
    }

    async fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        poll::HostPollable::ready(&mut *self.table, pollable).await
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        poll::HostPollable::drop(&mut *self.table, pollable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime_wasi::p2::pipe::SinkOutputStream;

    #[tokio::test]
    async fn a_poll_longer_than_the_handles_that_can_exist_is_refused() {
        let mut table = ResourceTable::new();
        let sink = table.push(SinkOutputStream).expect("a stream");
        let pollable = wasmtime_wasi::p2::subscribe(&mut table, sink).expect("its pollable");
        let copies = |n: usize| -> Vec<Resource<DynPollable>> {
            (0..n)
                .map(|_| Resource::new_borrow(pollable.rep()))
                .collect()
        };
        let cpu = super::super::cpu::CpuShares::new(1);
        let turn = Turn::new(
            &cpu,
            "t",
            1,
            std::time::Instant::now() + std::time::Duration::from_secs(60),
        );
        let mut bounded = Bounded {
            table: &mut table,
            turn: &turn,
            limit: std::time::Duration::from_secs(60),
        };
        let e = poll::Host::poll(&mut bounded, copies(MAX_HANDLES + 1))
            .await
            .expect_err("too long");
        assert!(
            e.to_string()
                .contains(&format!("{} pollables", MAX_HANDLES + 1)),
            "{e}"
        );
        // Within the bound, the poll is wasmtime-wasi's: a sink is always ready.
        let ready = poll::Host::poll(&mut bounded, copies(3))
            .await
            .expect("polled");
        assert_eq!(ready, vec![0, 1, 2]);
    }
}
