//! The invocation workers' time, shared by tenant rather than by invocation.
//!
//! Guests yield every epoch tick ([`super::engine::EPOCH_TICK`]) and the workers' scheduler
//! runs whichever task is next: a tenant with four invocations spinning in guest code held four
//! times the workers a tenant with one did, and the light tenant's guest stage (decoding two
//! images) waited behind their slices (`host/tests/attacks.rs`, "4 guests spinning at a time":
//! the light tenant at 6.4x its solo median, its decode stage 48.7 ms against 2.6).
//!
//! A tenant's invocation holds a run slot ([`Turn`]) while it runs guest code or the host's work
//! on its output, and gives it back while it waits in a host call (an object read, the device)
//! and at every tick. While `n` tenants want slots, each may hold `workers / n` of them (at
//! least one); a tenant alone may hold every worker, so the workers stay busy whatever the mix.
//! An invocation over its tenant's share waits at its next tick, or when it comes back from a
//! host call, until one of its tenant's slots is given back or the share grows. Its deadline
//! runs on while it waits: the time limit is wall time.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::Notify;

/// Run slots of the invocation workers, by tenant.
#[derive(Debug)]
pub struct CpuShares {
    workers: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    tenants: HashMap<Arc<str>, Load>,
}

/// One tenant's slots.
#[derive(Debug, Default)]
struct Load {
    /// Slots held: invocations running guest code (or the host's work on their output).
    running: usize,
    /// Tickets of the invocations waiting for a slot, in the order they came: the first takes
    /// the next slot.
    queue: VecDeque<u64>,
    /// The next ticket.
    next: u64,
    /// Wakes the waiting ones (they look again: a slot of their tenant came free, or the share
    /// grew).
    wake: Arc<Notify>,
}

impl Load {
    fn wants(&self) -> bool {
        self.running > 0 || !self.queue.is_empty()
    }
}

impl Inner {
    /// Tenants that hold or want slots.
    fn wanting(&self) -> usize {
        self.tenants.values().filter(|l| l.wants()).count()
    }

    /// Every tenant's waiting invocations look again (the share changed).
    fn wake_all(&self) {
        for l in self.tenants.values().filter(|l| !l.queue.is_empty()) {
            l.wake.notify_waiters();
        }
    }
}

impl CpuShares {
    pub fn new(workers: usize) -> Arc<Self> {
        Arc::new(Self {
            workers: workers.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Slots a tenant may hold while `wanting` tenants hold or want them.
    fn share(&self, wanting: usize) -> usize {
        (self.workers / wanting.max(1)).max(1)
    }

    /// Slots held and invocations waiting, for `tenant`.
    pub fn load(&self, tenant: &str) -> (usize, usize) {
        self.lock()
            .tenants
            .get(tenant)
            .map_or((0, 0), |l| (l.running, l.queue.len()))
    }

    /// A slot for `tenant` now if it is within its share and no invocation of its tenant waits
    /// ahead (`ticket`: this one's place in the queue, if it has one); else its place in the
    /// queue (a new one at the back if it had none) and the tenant's wake.
    fn try_take(&self, tenant: &Arc<str>, ticket: Option<u64>) -> Result<(), (u64, Arc<Notify>)> {
        let mut g = self.lock();
        let newcomer = !g.tenants.get(tenant).is_some_and(Load::wants);
        // A newcomer counts among the wanting: its own arrival shrinks the share.
        let share = self.share(g.wanting() + usize::from(newcomer));
        let load = g.tenants.entry(Arc::clone(tenant)).or_default();
        let first = match ticket {
            None => load.queue.is_empty(),
            Some(t) => load.queue.front() == Some(&t),
        };
        if load.running < share && first {
            if ticket.is_some() {
                load.queue.pop_front();
            }
            load.running += 1;
            // The next in line may fit too (the share grew by more than one).
            if !load.queue.is_empty() && load.running < share {
                load.wake.notify_waiters();
            }
            return Ok(());
        }
        let t = ticket.unwrap_or_else(|| {
            let t = load.next;
            load.next += 1;
            load.queue.push_back(t);
            t
        });
        Err((t, Arc::clone(&load.wake)))
    }

    /// Gives back one of `tenant`'s slots, or (`ticket`) a place in its queue.
    fn give(&self, tenant: &str, ticket: Option<u64>) {
        let mut g = self.lock();
        let before = g.wanting();
        let Some(load) = g.tenants.get_mut(tenant) else {
            return;
        };
        match ticket {
            Some(t) => load.queue.retain(|&q| q != t),
            None => load.running = load.running.saturating_sub(1),
        }
        if !load.queue.is_empty() {
            load.wake.notify_waiters();
        }
        if !load.wants() {
            g.tenants.remove(tenant);
        }
        if g.wanting() != before {
            g.wake_all();
        }
    }
}

/// One invocation's place in [`CpuShares`]: it holds a slot from [`Turn::take`] until
/// [`Turn::give`] (or its drop).
#[derive(Debug)]
pub struct Turn {
    cpu: Arc<CpuShares>,
    tenant: Arc<str>,
    held: Mutex<bool>,
}

/// A wait for a slot; gives its place in the queue back if dropped before it got one (the
/// invocation stopped at its deadline or its request went away).
struct Queued<'a> {
    turn: &'a Turn,
    ticket: Option<u64>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket {
            self.turn.cpu.give(&self.turn.tenant, Some(t));
        }
    }
}

impl Turn {
    pub fn new(cpu: &Arc<CpuShares>, tenant: &str) -> Arc<Self> {
        Arc::new(Self {
            cpu: Arc::clone(cpu),
            tenant: Arc::from(tenant),
            held: Mutex::new(false),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, bool> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot for the invocation, waiting while its tenant is over its share or others
    /// of its invocations wait ahead of it.
    pub async fn take(&self) {
        if *self.held() {
            return;
        }
        let mut queued = Queued {
            turn: self,
            ticket: None,
        };
        loop {
            let wake = match self.cpu.try_take(&self.tenant, queued.ticket) {
                Ok(()) => break,
                Err((t, wake)) => {
                    queued.ticket = Some(t);
                    wake
                }
            };
            // Registered before looking again, so that a slot given back in between wakes it.
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.cpu.try_take(&self.tenant, queued.ticket).is_ok() {
                break;
            }
            // A backstop: it looks again after a tick whatever happens.
            let _ = tokio::time::timeout(super::engine::EPOCH_TICK, notified).await;
        }
        queued.ticket = None;
        *self.held() = true;
    }

    /// Gives the slot back (a host call that waits, the invocation's end).
    pub fn give(&self) {
        let mut held = self.held();
        if *held {
            *held = false;
            drop(held);
            self.cpu.give(&self.tenant, None);
        }
    }

    /// A tick: the other tasks on the workers run first (the slot still held, so that its
    /// tenant's waiting invocations are not woken ahead of them: the scheduler runs a task woken
    /// on a worker next), then the slot goes back and the invocation takes one again when its
    /// tenant's share allows, behind its tenant's waiting invocations. A tenant that woke
    /// meanwhile and took a slot has shrunk the share.
    pub async fn tick(&self) {
        tokio::task::yield_now().await;
        self.give();
        self.take().await;
    }

    /// Runs `wait` (a host call's wait: an object read, the device) without a slot.
    pub async fn off<F: Future>(&self, wait: F) -> F::Output {
        self.give();
        let out = wait.await;
        self.take().await;
        out
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.give();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_tenant_alone_holds_every_worker_and_two_tenants_half_each() {
        rt().block_on(async {
            let cpu = CpuShares::new(2);
            let heavy: Vec<_> = (0..4).map(|_| Turn::new(&cpu, "heavy")).collect();
            heavy[0].take().await;
            heavy[1].take().await;
            assert_eq!(cpu.load("heavy"), (2, 0), "alone: both workers");
            // A third waits for a slot of its tenant.
            let third = heavy[2].take();
            tokio::pin!(third);
            assert!(
                tokio::time::timeout(Duration::from_millis(30), third.as_mut())
                    .await
                    .is_err()
            );
            assert_eq!(cpu.load("heavy"), (2, 1));
            // The light tenant arrives: the share is one each, and it gets its slot at once
            // (the heavy tenant's second drops at its next tick).
            let light = Turn::new(&cpu, "light");
            tokio::time::timeout(Duration::from_millis(5), light.take())
                .await
                .expect("the light tenant is within its share");
            assert_eq!(cpu.load("light"), (1, 0));
            heavy[1].give();
            assert!(
                tokio::time::timeout(Duration::from_millis(30), third.as_mut())
                    .await
                    .is_err(),
                "heavy holds its one slot: the third still waits"
            );
            // The light tenant goes to the device: heavy may hold two again.
            light.give();
            tokio::time::timeout(Duration::from_millis(30), third.as_mut())
                .await
                .expect("the share grew back");
            assert_eq!(cpu.load("heavy"), (2, 0));
            assert_eq!(cpu.load("light"), (0, 0));
        });
    }

    #[test]
    fn a_tick_lets_the_tenants_own_waiting_invocation_go_first() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let (a, b) = (Turn::new(&cpu, "t"), Turn::new(&cpu, "t"));
            a.take().await;
            let order = Mutex::new(Vec::new());
            let waits = async {
                b.take().await;
                order.lock().expect("order").push("b");
                b.give();
            };
            let ticks = async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                a.tick().await;
                order.lock().expect("order").push("a");
            };
            tokio::join!(waits, ticks);
            assert_eq!(*order.lock().expect("order"), ["b", "a"]);
        });
    }

    #[test]
    fn a_wait_dropped_gives_its_place_back() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let (a, b) = (Turn::new(&cpu, "t"), Turn::new(&cpu, "t"));
            a.take().await;
            assert!(
                tokio::time::timeout(Duration::from_millis(20), b.take())
                    .await
                    .is_err()
            );
            assert_eq!(cpu.load("t"), (1, 0), "the dropped wait is not counted");
            drop(a);
            assert_eq!(cpu.load("t"), (0, 0), "a dropped turn gives its slot back");
            tokio::time::timeout(Duration::from_millis(5), b.take())
                .await
                .expect("free now");
        });
    }
}
