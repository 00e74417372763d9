//! Per-tenant admission: `concurrency` invocations run at once, up to `queue` more wait for a
//! slot in arrival order, and past that the host answers 429 at once. A slot is held from
//! before the request's body is read until its response's bytes are sent (`http/invoke.rs`), so
//! neither request bodies nor outputs pile up beyond `concurrency` per tenant.
//!
//! A tenant's admission lives as long as the host does: a policy reload changes its limits,
//! never its count of running and waiting invocations, so a reload cannot let a tenant run
//! more than its `concurrency`.

use crate::locks::lock;
use crate::policy::{Policy, Tenant};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct State {
    running: usize,
    concurrency: usize,
    queue: usize,
    /// Waiters in arrival order, each with its own wake.
    waiting: VecDeque<(u64, Arc<Notify>)>,
    /// Waiters handed a slot that have not taken it yet.
    granted: HashSet<u64>,
    next: u64,
}

impl State {
    /// Hands free slots to waiters, oldest first, and wakes those (only: a slot given back
    /// had woken every waiter of the tenant, up to its queue of 1,024, to look and wait again,
    /// on the HTTP runtime's threads). A wake keeps its permit: none is lost to a waiter that
    /// has not begun to wait yet.
    fn grant(&mut self) {
        while self.running < self.concurrency {
            let Some((id, wake)) = self.waiting.pop_front() else {
                break;
            };
            self.running += 1;
            self.granted.insert(id);
            wake.notify_one();
        }
    }
}

/// One tenant's admission.
#[derive(Debug, Default)]
pub struct Admission {
    state: Mutex<State>,
}

/// A running slot, given back when dropped.
#[derive(Debug)]
pub struct Permit(Arc<Admission>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Leaves the queue (or gives back a slot granted too late) when a waiter goes away.
struct Waiter<'a> {
    admission: &'a Arc<Admission>,
    id: u64,
    done: bool,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = lock(&self.admission.state);
        if let Some(pos) = s.waiting.iter().position(|(w, _)| *w == self.id) {
            s.waiting.remove(pos);
        } else if s.granted.remove(&self.id) {
            drop(s);
            self.admission.release();
        }
    }
}

impl Admission {
    fn set_limits(&self, concurrency: usize, queue: usize) {
        let mut s = lock(&self.state);
        s.concurrency = concurrency;
        s.queue = queue;
        s.grant();
    }

    fn release(&self) {
        let mut s = lock(&self.state);
        s.running -= 1;
        s.grant();
    }

    /// Invocations running and waiting now.
    pub fn load(&self) -> (usize, usize) {
        let s = lock(&self.state);
        (s.running, s.waiting.len())
    }

    /// A running slot, after waiting for one if the queue has room; `None` when it has not.
    pub async fn admit(self: &Arc<Self>) -> Option<Permit> {
        let (id, wake) = {
            let mut s = lock(&self.state);
            if s.running < s.concurrency && s.waiting.is_empty() {
                s.running += 1;
                return Some(Permit(Arc::clone(self)));
            }
            if s.waiting.len() >= s.queue {
                return None;
            }
            let id = s.next;
            s.next += 1;
            let wake = Arc::new(Notify::new());
            s.waiting.push_back((id, Arc::clone(&wake)));
            (id, wake)
        };
        let mut waiter = Waiter {
            admission: self,
            id,
            done: false,
        };
        loop {
            if lock(&self.state).granted.remove(&id) {
                waiter.done = true;
                return Some(Permit(Arc::clone(self)));
            }
            wake.notified().await;
        }
    }
}

/// Every tenant's admission, by name.
#[derive(Debug, Default)]
pub struct Admissions {
    map: Mutex<HashMap<String, Arc<Admission>>>,
}

impl Admissions {
    /// The tenant's admission, with its current limits.
    pub fn of(&self, tenant: &Tenant) -> Arc<Admission> {
        let mut map = lock(&self.map);
        let a = map.entry(tenant.name.clone()).or_default();
        a.set_limits(tenant.limits.concurrency, tenant.limits.queue);
        Arc::clone(a)
    }

    /// Applies a reloaded policy's limits; counts of running and waiting invocations stay.
    pub fn reload(&self, policy: &Policy) {
        let map = lock(&self.map);
        for (name, a) in map.iter() {
            if let Some(t) = policy.tenants.get(name) {
                a.set_limits(t.limits.concurrency, t.limits.queue);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(concurrency: usize, queue: usize) -> Arc<Admission> {
        let a = Arc::new(Admission::default());
        a.set_limits(concurrency, queue);
        a
    }

    #[tokio::test]
    async fn slots_then_queue_then_refusal_in_arrival_order() {
        let a = admission(1, 1);
        let p1 = a.admit().await.expect("a slot");
        let a2 = Arc::clone(&a);
        let waiting = tokio::spawn(async move { a2.admit().await.map(|_| ()) });
        tokio::task::yield_now().await;
        while a.load().1 == 0 {
            tokio::task::yield_now().await;
        }
        assert!(a.admit().await.is_none(), "the queue is full");
        drop(p1);
        assert_eq!(waiting.await.expect("join"), Some(()));
        assert_eq!(a.load(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_gives_its_place_back() {
        let a = admission(1, 4);
        let p1 = a.admit().await.expect("a slot");
        let gone = tokio::time::timeout(std::time::Duration::from_millis(20), a.admit()).await;
        assert!(gone.is_err(), "it waited");
        assert_eq!(a.load(), (1, 0), "and left the queue");
        drop(p1);
        assert_eq!(a.load(), (0, 0));
        let _p = a.admit().await.expect("a slot again");
    }

    /// Counts the wakes of a future polled with it.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_slot_given_back_wakes_the_waiter_it_is_granted_to_only() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let a = admission(1, 8);
        let mut running = Some(futures::executor::block_on(a.admit()).expect("a slot"));
        let mut waits: Vec<_> = (0..4).map(|_| Box::pin(a.admit())).collect();
        let counts: Vec<Arc<Count>> = waits
            .iter_mut()
            .map(|w| {
                let c = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
                let waker = Waker::from(Arc::clone(&c));
                assert!(
                    w.as_mut()
                        .poll(&mut Context::from_waker(&waker))
                        .is_pending()
                );
                c
            })
            .collect();
        assert_eq!(a.load(), (1, 4));
        let woken = || {
            counts
                .iter()
                .map(|c| c.0.load(std::sync::atomic::Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        drop(running.take());
        assert_eq!(
            woken(),
            [1, 0, 0, 0],
            "the first waiter, granted the slot, only"
        );
        let waker = Waker::from(Arc::clone(&counts[0]));
        let Poll::Ready(Some(permit)) = waits[0].as_mut().poll(&mut Context::from_waker(&waker))
        else {
            panic!("the first waiter has its slot");
        };
        assert_eq!(a.load(), (1, 3));
        drop(permit);
        assert_eq!(woken(), [1, 1, 0, 0], "the next");
        // A waiter that goes away gives its place back and wakes no one.
        drop(waits.remove(2));
        assert_eq!(woken(), [1, 1, 0, 0]);
        assert_eq!(a.load(), (1, 1));
    }

    #[tokio::test]
    async fn new_limits_never_let_more_run_than_allowed() {
        let a = admission(1, 8);
        let p1 = a.admit().await.expect("slot");
        // A reload that keeps concurrency 1: still one at a time.
        a.set_limits(1, 8);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), a.admit())
                .await
                .is_err()
        );
        // Raising it lets a waiter in; lowering it below `running` admits nobody new.
        a.set_limits(2, 8);
        let p2 = a.admit().await.expect("second slot");
        a.set_limits(1, 8);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), a.admit())
                .await
                .is_err()
        );
        drop((p1, p2));
        assert_eq!(a.load(), (0, 0));
    }
}
