//! The invocation workers' time, shared by tenant rather than by invocation.
//!
//! Guests yield every epoch tick ([`super::engine::EPOCH_TICK`]) and the workers' scheduler
//! runs whichever task is next: a tenant with four invocations spinning in guest code held four
//! times the workers a tenant with one did, and the light tenant's guest stage (decoding two
//! images) waited behind their slices (`host/tests/attacks.rs`, "4 guests spinning at a time":
//! the light tenant at 6.4x its solo median, its decode stage 48.7 ms against 2.6).
//!
//! A tenant's invocation holds a run slot ([`Turn`]) while it runs guest code, the host's work
//! on its output or the local store's work for its calls (on a blocking thread, paced at each
//! tick: [`Turn::hold`], [`Pace`]), and gives it back while it waits in a host call (an S3
//! read, a model load, the device, `wasi:io/poll`) and, at a tick, when another tenant needs
//! it. While
//! tenants of weights `w1 .. wn` (the policy's `weight`, the device's too) want slots, tenant
//! `i` may hold `workers * wi / (w1 + .. + wn)` of them, rounded down, at least one (equal
//! weights: `workers / n`), and a tenant over its share may take a free worker while no tenant
//! holding fewer per unit of weight waits for one: a tenant alone holds every worker, and the
//! workers stay busy whatever the mix. Shares are whole workers, so weights shape them only
//! where there are more workers than wanting tenants. An invocation that may not
//! hold another slot waits, behind its tenant's invocations that came before it, until a slot
//! comes free or the share grows, and no longer than its deadline (the time limit is wall time).
//! Three waits go ahead of the tenant's queue instead, in the order they came among themselves:
//! a model's load (one per tenant at a time, which other tenants may be waiting for), an ended
//! invocation's teardown (freeing its memory; [`Turn::finally`]) and a host call woken from its
//! wait ([`Turn::off`]).

use super::engine::EPOCH_TICK;
use crate::account::Pace;
use crate::locks::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;
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
    /// Its weight (the policy's; the latest invocation's, should a reload change it).
    weight: u32,
    /// Slots held: invocations running guest code (or the host's work on their output).
    running: usize,
    /// Tickets of the invocations waiting for a slot, in the order they came, each with its
    /// wake: the first takes the next slot, so only the first is woken to look again (a slot
    /// came free, or the share grew), and each behind it when it comes first. Those that go
    /// ahead ([`Turn::sibling`], [`Turn::off`]'s wakes; `true`) are before all others, in the
    /// order they came: put at the very front, the newest went first, and a tenant whose calls
    /// woke every millisecond kept its oldest (a load, a device wait holding room back from
    /// everyone) from the front until its deadline.
    queue: VecDeque<(u64, Arc<Notify>, bool)>,
    /// The next ticket.
    next: u64,
}

impl Load {
    fn wants(&self) -> bool {
        self.running > 0 || !self.queue.is_empty()
    }

    fn weight(&self) -> u64 {
        u64::from(self.weight.max(1))
    }

    /// The first waiting invocation looks again (a permit, if it is not waiting yet).
    fn wake_first(&self) {
        if let Some((_, wake, _)) = self.queue.front() {
            wake.notify_one();
        }
    }
}

impl Inner {
    /// Weights of the tenants that hold or want slots, together.
    fn wanting(&self) -> u64 {
        self.tenants
            .values()
            .filter(|l| l.wants())
            .map(Load::weight)
            .sum()
    }

    /// Slots held, all tenants.
    fn running(&self) -> usize {
        self.tenants.values().map(|l| l.running).sum()
    }

    /// Whether a tenant other than `tenant` (of weight `weight`) waits for a slot while
    /// holding fewer than `running` per unit of weight: a free worker goes to it first.
    fn poorer_waits(&self, tenant: &str, running: usize, weight: u64) -> bool {
        self.tenants.iter().any(|(t, l)| {
            &**t != tenant
                && !l.queue.is_empty()
                && (l.running as u64) * weight < (running as u64) * l.weight()
        })
    }

    /// Every tenant's first waiting invocation looks again (a slot came free, or the share
    /// grew). Only the first of a tenant's may take a slot: waking the others too cost every
    /// slot given back a lock and a look for each invocation waiting, every tenant's, work
    /// charged to no one.
    fn wake_all(&self) {
        for l in self.tenants.values() {
            l.wake_first();
        }
    }

    /// Gives back one of `tenant`'s slots, or (`ticket`) a place in its queue.
    fn give(&mut self, tenant: &str, ticket: Option<u64>) {
        let Some(load) = self.tenants.get_mut(tenant) else {
            return;
        };
        match ticket {
            Some(t) => load.queue.retain(|(q, _, _)| *q != t),
            None => load.running = load.running.saturating_sub(1),
        }
        if !load.wants() {
            self.tenants.remove(tenant);
        }
        // A worker came free or the share grew: whoever waits looks again.
        self.wake_all();
    }
}

impl CpuShares {
    pub fn new(workers: usize) -> Arc<Self> {
        Arc::new(Self {
            workers: workers.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Slots a tenant of weight `weight` may hold while tenants of weights summing to
    /// `wanting` (its own included) hold or want them.
    fn share(&self, weight: u64, wanting: u64) -> usize {
        let share = self.workers as u64 * weight / wanting.max(1);
        usize::try_from(share).unwrap_or(usize::MAX).max(1)
    }

    /// Whether `tenant` (of weight `weight`), holding `running` slots and none of its
    /// invocations waiting ahead, may hold one more while `held` are held in all and tenants of
    /// weights summing to `wanting` want them: within its share, or a worker is free and no
    /// tenant holding fewer per unit of weight waits for one (the workers stay busy whatever
    /// the mix).
    fn may_hold(
        &self,
        g: &Inner,
        tenant: &str,
        weight: u64,
        wanting: u64,
        running: usize,
        held: usize,
    ) -> bool {
        running < self.share(weight, wanting)
            || (held < self.workers && !g.poorer_waits(tenant, running, weight))
    }

    /// Slots held and invocations waiting, for `tenant`.
    pub fn load(&self, tenant: &str) -> (usize, usize) {
        self.lock()
            .tenants
            .get(tenant)
            .map_or((0, 0), |l| (l.running, l.queue.len()))
    }

    /// A slot for `tenant` now if it may hold one more and no invocation of its tenant waits
    /// ahead (`ticket`: this one's place in the queue, if it has one; `ahead`: a newcomer that
    /// goes before those waiting); else its place in the queue (a new one at the back, or the
    /// front if `ahead`, if it had none), its wake, and whether it is first.
    fn try_take(
        &self,
        tenant: &Arc<str>,
        weight: u32,
        ticket: Option<u64>,
        ahead: bool,
    ) -> Result<(), Waiting> {
        let mut g = self.lock();
        // Left wanting on either path below: it takes a slot or a place in the queue.
        let load = g.tenants.entry(Arc::clone(tenant)).or_default();
        load.weight = weight;
        let (weight, running) = (load.weight(), load.running);
        let first = match ticket {
            // Ahead of all but those ahead already.
            None => load.queue.front().is_none_or(|(_, _, a)| ahead && !a),
            Some(t) => load.queue.front().is_some_and(|(q, _, _)| *q == t),
        };
        // A newcomer counts among the wanting: its own arrival shrinks the shares.
        let newcomer = if load.wants() { 0 } else { weight };
        let wanting = g.wanting() + newcomer;
        let may = first && self.may_hold(&g, tenant, weight, wanting, running, g.running());
        let load = g.tenants.entry(Arc::clone(tenant)).or_default();
        if may {
            if ticket.is_some() {
                load.queue.pop_front();
            }
            load.running += 1;
            // The next in line may fit too.
            load.wake_first();
            return Ok(());
        }
        let ticket = ticket.unwrap_or_else(|| {
            let t = load.next;
            load.next += 1;
            let place = (t, Arc::new(Notify::new()), ahead);
            match ahead {
                true => {
                    let at = load.queue.iter().take_while(|(_, _, a)| *a).count();
                    load.queue.insert(at, place);
                }
                false => load.queue.push_back(place),
            }
            t
        });
        let (at, wake) = load
            .queue
            .iter()
            .enumerate()
            .find_map(|(i, (q, w, _))| (*q == ticket).then(|| (i, Arc::clone(w))))
            // A ticket not in the queue (never, under the lock): it waits as the first.
            .unwrap_or_else(|| (0, Arc::new(Notify::new())));
        Err(Waiting {
            ticket,
            wake,
            first: at == 0,
        })
    }

    /// At a tick: whether `tenant`'s invocation keeps its slot, which it does if, giving it
    /// back, it would be given it again first; else it gives it back (one step under the lock,
    /// so that no other tenant sees the tenant gone in between).
    fn keep(&self, tenant: &str) -> bool {
        let mut g = self.lock();
        let (wanting, held) = (g.wanting(), g.running());
        let Some(load) = g.tenants.get(tenant) else {
            return false;
        };
        let (weight, running, alone) = (load.weight(), load.running, load.queue.is_empty());
        // As if given back: one slot fewer, its own and in all.
        if alone && running > 0 && self.may_hold(&g, tenant, weight, wanting, running - 1, held - 1)
        {
            return true;
        }
        g.give(tenant, None);
        false
    }

    /// Whether `tenant` has other invocations running or waiting beside one that holds a slot
    /// (`held`) or not.
    fn others_of(&self, tenant: &str, held: bool) -> bool {
        self.lock()
            .tenants
            .get(tenant)
            .is_some_and(|l| l.running > usize::from(held) || !l.queue.is_empty())
    }

    /// Gives back one of `tenant`'s slots, or (`ticket`) a place in its queue.
    fn give(&self, tenant: &str, ticket: Option<u64>) {
        self.lock().give(tenant, ticket);
    }
}

/// An invocation's place in its tenant's queue for a slot.
struct Waiting {
    ticket: u64,
    /// Woken when it is first and a slot may be free, or when it comes first.
    wake: Arc<Notify>,
    first: bool,
}

/// One invocation's place in [`CpuShares`]: it holds a slot from [`Turn::take`] until
/// [`Turn::give`] (or its drop). It waits for one until its deadline at most.
#[derive(Debug)]
pub struct Turn {
    cpu: Arc<CpuShares>,
    tenant: Arc<str>,
    /// The tenant's weight.
    weight: u32,
    until: Instant,
    held: Mutex<bool>,
    /// Waits at the front of its tenant's queue, not the back ([`Turn::sibling`]).
    ahead: bool,
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
    /// The place of an invocation of `tenant` (of weight `weight`) whose deadline is `until`.
    pub fn new(cpu: &Arc<CpuShares>, tenant: &str, weight: u32, until: Instant) -> Arc<Self> {
        Arc::new(Self {
            cpu: Arc::clone(cpu),
            tenant: Arc::from(tenant),
            weight,
            until,
            held: Mutex::new(false),
            ahead: false,
        })
    }

    /// Another place of the same invocation (tenant, weight, deadline), holding no slot: for
    /// host work on its behalf on another thread while the invocation itself waits (a model's
    /// load), which takes its own slot of the tenant's share ([`Pace`]) and gives it back when
    /// dropped. It waits at the front of its tenant's queue: a tenant loads one model at a
    /// time, and other tenants may be waiting for that load (a shared model they found
    /// `Loading`). Behind the tenant's own invocations, it began only once each had had a
    /// slot, and a light tenant calling the model meanwhile ran into its time limit.
    pub fn sibling(&self) -> Arc<Self> {
        Arc::new(Self {
            cpu: Arc::clone(&self.cpu),
            tenant: Arc::clone(&self.tenant),
            weight: self.weight,
            until: self.until,
            held: Mutex::new(false),
            ahead: true,
        })
    }

    fn held(&self) -> MutexGuard<'_, bool> {
        lock(&self.held)
    }

    /// Takes a slot for the invocation, waiting while its tenant may not hold another or
    /// others of its invocations wait ahead of it; whether it holds one (not if its deadline
    /// came first: the guest is then stopped at its next epoch check).
    pub async fn take(&self) -> bool {
        self.take_until(self.until, self.ahead).await
    }

    /// [`Turn::take`], waiting until `until` at most, at the front of the tenant's queue if
    /// `ahead`.
    async fn take_until(&self, until: Instant, ahead: bool) -> bool {
        if *self.held() {
            return true;
        }
        let mut queued = Queued {
            turn: self,
            ticket: None,
        };
        loop {
            let waiting = match self
                .cpu
                .try_take(&self.tenant, self.weight, queued.ticket, ahead)
            {
                Ok(()) => break,
                Err(w) => w,
            };
            queued.ticket = Some(waiting.ticket);
            // Its own wake, which keeps a permit: one given between the look and the wait is
            // not lost.
            let notified = waiting.wake.notified();
            let now = Instant::now();
            if now >= until {
                return false;
            }
            // The first looks again after a tick whatever happens (a backstop); those behind it
            // wait for their wake, which comes when they come first, or for their deadline.
            let wait = if waiting.first {
                EPOCH_TICK.min(until - now)
            } else {
                until - now
            };
            let _ = tokio::time::timeout(wait, notified).await;
        }
        queued.ticket = None;
        *self.held() = true;
        true
    }

    /// Runs `f`, the invocation's own work after its deadline or after its caller went away
    /// (freeing its memory: unmapping a guest's memory and the tensors it kept takes tens of
    /// ms a GiB), on a slot of its tenant's share: the invocation's, if it holds one, else one
    /// taken at the front of the tenant's queue within `wait`, or none past it (the memory is
    /// never kept waiting long). An invocation stopped in a host call's wait holds none, and
    /// its memory was freed on a worker while its tenant's other invocations held their whole
    /// share.
    pub async fn finally<T>(&self, wait: std::time::Duration, f: impl FnOnce() -> T) -> T {
        if *self.held() {
            return f();
        }
        let place = self.sibling();
        place.take_until(Instant::now() + wait, true).await;
        let out = f();
        drop(place);
        out
    }

    /// Whether other invocations of the tenant run or wait for a slot now: a wait for the
    /// share then is (at least in part) a wait behind the tenant's own work.
    pub fn beside_own(&self) -> bool {
        let held = *self.held();
        self.cpu.others_of(&self.tenant, held)
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
    /// on a worker next); then the invocation keeps its slot if it may, else gives it back and
    /// waits behind its tenant's waiting invocations. A tenant that woke meanwhile and took a
    /// slot has shrunk the share.
    pub async fn tick(&self) {
        tokio::task::yield_now().await;
        if !self.keeps() {
            self.take().await;
        }
    }

    /// Whether the invocation holds a slot and keeps it, as at a tick; one it may not keep is
    /// given back, and it must wait for its turn ([`Turn::take`]).
    fn keeps(&self) -> bool {
        if !*self.held() {
            return false;
        }
        if self.cpu.keep(&self.tenant) {
            return true;
        }
        *self.held() = false;
        false
    }

    /// Runs `work`, a host call whose work is done for the tenant on another thread (the local
    /// store's file system calls, which [`Pace`] the invocation at each tick), holding the slot
    /// throughout: unlike [`Turn::off`]'s waits, its waits are that work, and the tenant's
    /// share covers it.
    pub async fn hold<F: Future>(&self, work: F) -> F::Output {
        if !*self.held() {
            self.take().await;
        }
        let out = work.await;
        // Past the deadline a pace may have given the slot back without getting one again.
        if !*self.held() {
            self.take().await;
        }
        out
    }

    /// Runs `wait` (a host call: an S3 read, the device, a guest's sleep) on the slot
    /// whenever it runs and without it while it waits: each poll of the call is work for the
    /// tenant on a worker (`wasi:io/poll` building a future for each of up to 10,000
    /// pollables, or looking at them again when one is ready; an S3 listing parsing the page
    /// that came), so it runs on a slot of the tenant's share, taken again after each wait
    /// (the call's waker wakes this task, which takes a slot before it polls the call
    /// again). A call that is ready when first polled never gives the slot back. Woken, it
    /// takes the slot at the front of its tenant's queue: behind the tenant's own invocations
    /// it waited a tick for each of them, and a device wait whose room the neighbours' batches
    /// gave back holds that room from every other tenant until it takes it (see
    /// [`crate::device::budget`]), so a tenant spinning in its other invocations kept the
    /// device's memory unused for a tick per invocation.
    pub async fn off<F: Future>(&self, wait: F) -> F::Output {
        let mut wait = std::pin::pin!(wait);
        let woken = Arc::new(Woken(Notify::new()));
        let waker = Waker::from(Arc::clone(&woken));
        loop {
            if let Poll::Ready(out) = wait.as_mut().poll(&mut Context::from_waker(&waker)) {
                return out;
            }
            self.give();
            // A wake that came during the poll left its permit: no wake is lost.
            woken.0.notified().await;
            // Past the deadline it polls without one: the call's own deadline ends it.
            self.take_until(self.until, true).await;
        }
    }
}

impl Turn {
    /// [`Self::off`] for a call with no deadline of its own (a remote store's request, a
    /// guest's `wasi:io/poll`): it is not polled past the invocation's deadline, and answers
    /// `None` there. Past it, [`Self::off`] polls without a slot, and each poll may be work
    /// for the tenant (an S3 listing parsing the page that came, a poll of 10,000 pollables
    /// building their futures again), done outside its share until the invocation's guard
    /// ended it, its grace later.
    pub async fn off_within<F: Future>(&self, wait: F) -> Option<F::Output> {
        let until = self.until;
        let mut wait = std::pin::pin!(wait);
        let within = std::future::poll_fn(|cx| {
            if Instant::now() >= until {
                return Poll::Ready(None);
            }
            wait.as_mut().poll(cx).map(Some)
        });
        // The timer wakes it at the deadline, when it answers at once.
        self.off(tokio::time::timeout_at(until.into(), within))
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.give();
    }
}

/// The local store's work for an invocation (a walk's entries, a read's chunks, on a blocking
/// thread) runs on the invocation's slot, held for it by [`Turn::hold`], and at each tick lets
/// the tenant's share decide as a guest's epoch tick does: the job goes on, or gives its
/// blocking thread back and waits for its turn as the invocation's task would; past the
/// invocation's deadline it stops.
impl Pace for Turn {
    fn pace(&self) -> bool {
        // Past the deadline the work stops: the invocation is stopped within its guard's grace,
        // and work done meanwhile would be done without a slot (none is taken past it).
        if Instant::now() >= self.until {
            return false;
        }
        // Called on a blocking thread of the workers' runtime (a profile's layers), where a
        // thread may wait on the runtime's futures.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.block_on(self.tick());
        }
        *self.held()
    }

    fn try_pace(&self) -> Option<bool> {
        if Instant::now() >= self.until {
            return Some(false);
        }
        // As at a guest's tick: it keeps the slot if it may, else gives it back and waits
        // behind its tenant's waiting invocations ([`Pace::turn`]).
        self.keeps().then_some(true)
    }

    fn turn(&self) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(self.take())
    }
}

/// A host call's waker in [`Turn::off`]: it wakes the invocation's task, which takes a slot
/// before it polls the call again.
struct Woken(Notify);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ObjectError;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn turn(cpu: &Arc<CpuShares>, tenant: &str) -> Arc<Turn> {
        weighted(cpu, tenant, 1)
    }

    fn weighted(cpu: &Arc<CpuShares>, tenant: &str, weight: u32) -> Arc<Turn> {
        Turn::new(
            cpu,
            tenant,
            weight,
            Instant::now() + Duration::from_secs(60),
        )
    }

    /// Well under the backstop's tick: what completes within it was woken, not polled again.
    const AT_ONCE: Duration = Duration::from_millis(3);

    async fn at_once(what: &str, f: impl Future<Output = bool>) {
        let got = tokio::time::timeout(AT_ONCE, f).await;
        assert_eq!(got, Ok(true), "{what}");
    }

    async fn waits(f: std::pin::Pin<&mut impl Future>) -> bool {
        tokio::time::timeout(Duration::from_millis(30), f)
            .await
            .is_err()
    }

    #[test]
    fn a_tenant_alone_holds_every_worker_and_two_tenants_half_each() {
        rt().block_on(async {
            let cpu = CpuShares::new(2);
            let heavy: Vec<_> = (0..3).map(|_| turn(&cpu, "heavy")).collect();
            at_once("alone: a first worker", heavy[0].take()).await;
            at_once("alone: both workers", heavy[1].take()).await;
            let third = heavy[2].take();
            tokio::pin!(third);
            assert!(waits(third.as_mut()).await, "no third worker");
            assert_eq!(cpu.load("heavy"), (2, 1));
            // The light tenant arrives: its share is one, which it gets at once (the heavy
            // tenant's second gives its slot back at its next tick).
            let light = turn(&cpu, "light");
            at_once("the light tenant within its share", light.take()).await;
            let tick = heavy[1].tick();
            tokio::pin!(tick);
            assert!(
                tokio::time::timeout(Duration::from_millis(30), tick.as_mut())
                    .await
                    .is_err(),
                "over its share: it waits at its tick"
            );
            assert_eq!(cpu.load("heavy"), (1, 2));
            // Its first ticks while its tenant's invocations wait: the slot goes to the first
            // in line, and it queues behind the others.
            let tick0 = heavy[0].tick();
            tokio::pin!(tick0);
            let (t0, got) = tokio::join!(
                tokio::time::timeout(Duration::from_millis(30), tick0.as_mut()),
                tokio::time::timeout(AT_ONCE, third.as_mut()),
            );
            assert!(t0.is_err(), "behind its tenant's waiting invocations");
            assert_eq!(got, Ok(true), "the first in line got the slot");
            assert_eq!(cpu.load("heavy"), (1, 2));
            // The light tenant goes to the device: the share grows back to two, and the next
            // in line (the second's tick) gets a worker at once.
            light.give();
            assert_eq!(
                tokio::time::timeout(AT_ONCE, tick.as_mut()).await,
                Ok(()),
                "the share grew back"
            );
            assert_eq!(cpu.load("heavy"), (2, 1));
            assert_eq!(cpu.load("light"), (0, 0));
        });
    }

    #[test]
    fn a_free_worker_goes_to_whoever_waits_with_fewest_slots() {
        rt().block_on(async {
            // Three tenants on four workers: a share of one each, and the fourth worker to
            // whoever wants it.
            let cpu = CpuShares::new(4);
            let (a, b, c) = (turn(&cpu, "a"), turn(&cpu, "b"), turn(&cpu, "c"));
            for (t, what) in [(&a, "a"), (&b, "b"), (&c, "c")] {
                at_once(what, t.take()).await;
            }
            let a2 = turn(&cpu, "a");
            at_once("a free worker, nobody waiting", a2.take()).await;
            let (b2, c2) = (turn(&cpu, "b"), turn(&cpu, "c"));
            let b2t = b2.take();
            let c2t = c2.take();
            tokio::pin!(b2t, c2t);
            assert!(waits(b2t.as_mut()).await && waits(c2t.as_mut()).await);
            // a2 ticks: b and c, waiting with one slot each, hold no fewer than a would after
            // giving its second back, so a keeps it; when it ends, b's (first in line by
            // tenant) or c's waiting invocation takes the worker at once, not both.
            a2.tick().await;
            assert_eq!(cpu.load("a"), (2, 0));
            drop(a2);
            let first = tokio::select! {
                r = b2t.as_mut() => r,
                r = c2t.as_mut() => r,
            };
            assert!(first);
            assert_eq!(cpu.load("b").0 + cpu.load("c").0, 3);
            assert_eq!(cpu.lock().running(), 4);
        });
    }

    #[test]
    fn shares_follow_the_tenants_weights() {
        rt().block_on(async {
            // Eight workers: a tenant of weight 3 alone holds all eight.
            let cpu = CpuShares::new(8);
            let gold: Vec<_> = (0..8).map(|_| weighted(&cpu, "gold", 3)).collect();
            for g in &gold {
                at_once("alone: every worker", g.take()).await;
            }
            // A tenant of weight 1 arrives: its share is 8 * 1/4, which it gets at once.
            let tin: Vec<_> = (0..3).map(|_| weighted(&cpu, "tin", 1)).collect();
            at_once("tin's first", tin[0].take()).await;
            at_once("tin's second", tin[1].take()).await;
            {
                let third = tin[2].take();
                tokio::pin!(third);
                assert!(waits(third.as_mut()).await, "past tin's share of two");
            }
            // Gold's share is now 8 * 3/4: two of its ticks give slots back, and those
            // invocations wait.
            let t0 = gold[0].tick();
            let t1 = gold[1].tick();
            tokio::pin!(t0, t1);
            assert!(waits(t0.as_mut()).await, "gold over its share of six");
            assert!(waits(t1.as_mut()).await, "gold still over it");
            assert_eq!(cpu.load("gold"), (6, 2));
            assert_eq!(cpu.load("tin"), (2, 0));
            // Gold's next tick hands its slot to its first waiting invocation: still six.
            let t2 = gold[2].tick();
            tokio::pin!(t2);
            let (t0, t2) = tokio::join!(
                tokio::time::timeout(AT_ONCE, t0.as_mut()),
                tokio::time::timeout(Duration::from_millis(30), t2.as_mut()),
            );
            assert_eq!(t0, Ok(()), "the first in line took the slot");
            assert!(t2.is_err(), "the ticking one queues behind the other");
            assert_eq!(cpu.load("gold"), (6, 2));
            // Tin leaves: gold's share is every worker again.
            drop(tin);
            assert_eq!(cpu.load("tin"), (0, 0));
            assert_eq!(
                tokio::time::timeout(AT_ONCE, t1.as_mut()).await,
                Ok(()),
                "the share grew back"
            );
            assert_eq!(cpu.load("gold"), (7, 1));
        });
    }

    #[test]
    fn a_free_worker_goes_to_the_tenant_holding_fewest_per_unit_of_weight() {
        let load = |weight, running| Load {
            weight,
            running,
            queue: VecDeque::from([(0, Arc::new(Notify::new()), false)]),
            ..Load::default()
        };
        let mut g = Inner::default();
        g.tenants.insert(Arc::from("big"), load(4, 3));
        g.tenants.insert(Arc::from("small"), load(1, 1));
        // Per unit of weight big holds 3/4, small 1: big waits poorer though it holds more.
        assert!(g.poorer_waits("small", 1, 1));
        assert!(!g.poorer_waits("big", 3, 4));
        // Of equal weights, the one holding fewer slots.
        g.tenants.insert(Arc::from("big"), load(1, 3));
        assert!(!g.poorer_waits("small", 1, 1));
        assert!(g.poorer_waits("big", 3, 1));
    }

    #[test]
    fn a_tick_lets_the_tenants_own_waiting_invocation_go_first() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let (a, b) = (turn(&cpu, "t"), turn(&cpu, "t"));
            at_once("a", a.take()).await;
            let order = Mutex::new(Vec::new());
            let waits = async {
                assert!(b.take().await);
                order.lock().expect("order").push("b");
                b.give();
            };
            let ticks = async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                a.tick().await;
                order.lock().expect("order").push("a");
            };
            tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(waits, ticks) })
                .await
                .expect("no deadlock");
            assert_eq!(*order.lock().expect("order"), ["b", "a"]);
        });
    }

    #[test]
    fn a_host_calls_work_runs_on_the_slot_and_its_waits_do_not() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let t = turn(&cpu, "t");
            at_once("a slot", t.take()).await;
            let seen = Mutex::new(Vec::new());
            let look = |who| seen.lock().expect("seen").push((who, cpu.load("t").0));
            // Its set-up, a wait (during which another task looks), what it does when woken.
            let call = t.off(async {
                look("set-up");
                tokio::time::sleep(Duration::from_millis(20)).await;
                look("woken");
            });
            let meanwhile = async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                look("while it waits");
            };
            tokio::join!(call, meanwhile);
            assert_eq!(
                *seen.lock().expect("seen"),
                [("set-up", 1), ("while it waits", 0), ("woken", 1)]
            );
            assert_eq!(cpu.load("t"), (1, 0), "held again after the call");
            // A call ready at once keeps the slot throughout.
            let kept = t.off(async { cpu.load("t").0 }).await;
            assert_eq!(kept, 1);
        });
    }

    /// A call with no deadline of its own is not polled past the invocation's, however often
    /// it wakes: each poll may be work for the tenant, and past the deadline it would be
    /// polled without a slot.
    #[test]
    fn a_call_is_not_polled_past_the_invocations_deadline() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let until = Instant::now() + Duration::from_millis(30);
            let t = Turn::new(&cpu, "t", 1, until);
            at_once("a slot", t.take()).await;
            let polls: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
            // Busy for 2 ms at each poll, then wakes itself at once, for 40 polls (80 ms).
            let busy = std::future::poll_fn(|cx| {
                let mut seen = polls.lock().expect("polls");
                seen.push(Instant::now());
                if seen.len() >= 40 {
                    return Poll::Ready(());
                }
                drop(seen);
                let spin = Instant::now() + Duration::from_millis(2);
                while Instant::now() < spin {
                    std::hint::spin_loop();
                }
                cx.waker().wake_by_ref();
                Poll::<()>::Pending
            });
            assert_eq!(t.off_within(busy).await, None);
            let polls = polls.lock().expect("polls");
            let late = polls.iter().filter(|&&at| at >= until).count();
            assert!(polls.len() > 1, "{} polls", polls.len());
            assert_eq!(late, 0, "{late} of {} polls past the deadline", polls.len());
        });
    }

    #[test]
    fn a_host_call_woken_takes_its_tenants_next_slot_before_its_waiting_invocations() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let (w, b, c) = (turn(&cpu, "t"), turn(&cpu, "t"), turn(&cpu, "t"));
            at_once("w", w.take()).await;
            let order = Mutex::new(Vec::new());
            let got = |who| order.lock().expect("order").push(who);
            // w waits in a host call (its slot goes to b, c queues behind), is woken while b
            // still runs, and b's tick hands the slot on: to w, not to c.
            let call = async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                w.off(tokio::time::sleep(Duration::from_millis(20))).await;
                got("w");
                w.give();
            };
            let runs = async {
                assert!(b.take().await);
                tokio::time::sleep(Duration::from_millis(60)).await;
                b.tick().await;
                got("b");
                b.give();
            };
            let queued = async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                assert!(c.take().await);
                got("c");
                c.give();
            };
            tokio::time::timeout(Duration::from_secs(5), async {
                tokio::join!(call, runs, queued)
            })
            .await
            .expect("no deadlock");
            assert_eq!(*order.lock().expect("order"), ["w", "c", "b"]);
        });
    }

    #[test]
    fn host_calls_woken_take_the_slot_in_the_order_they_woke() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let (w, x, a) = (turn(&cpu, "t"), turn(&cpu, "t"), turn(&cpu, "t"));
            at_once("w", w.take()).await;
            let order = Mutex::new(Vec::new());
            let got = |who| order.lock().expect("order").push(who);
            // w and x wait in host calls, w woken first; a holds the slot meanwhile and ticks.
            let first = async {
                w.off(tokio::time::sleep(Duration::from_millis(5))).await;
                got("w");
                w.give();
            };
            let second = async {
                assert!(x.take().await);
                x.off(tokio::time::sleep(Duration::from_millis(20))).await;
                got("x");
                x.give();
            };
            let runs = async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                assert!(a.take().await);
                tokio::time::sleep(Duration::from_millis(60)).await;
                a.tick().await;
                got("a");
                a.give();
            };
            tokio::time::timeout(Duration::from_secs(5), async {
                tokio::join!(first, second, runs)
            })
            .await
            .expect("no deadlock");
            assert_eq!(*order.lock().expect("order"), ["w", "x", "a"]);
        });
    }

    /// A runtime with blocking threads beside two workers, as the invocation workers' is; one
    /// blocking thread, which a job waiting on it would hold.
    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A local store whose bucket `b` holds 1,000 one-byte objects (and the directory to
    /// keep while it is used).
    fn thousand_objects() -> (tempfile::TempDir, crate::store::local::Local) {
        let dir = tempfile::tempdir().expect("tmp");
        let bucket = dir.path().join("b");
        std::fs::create_dir(&bucket).expect("bucket");
        for i in 0..1000 {
            std::fs::write(bucket.join(format!("{i:04}")), b"x").expect("object");
        }
        let store = crate::store::local::Local::open(dir.path()).expect("store");
        (dir, store)
    }

    #[test]
    fn the_local_stores_work_holds_the_slot_and_gives_it_and_its_thread_up_at_a_tick() {
        multi_thread().block_on(async {
            let (_dir, store) = thousand_objects();
            let store = Arc::new(store);
            let cpu = CpuShares::new(2);
            let heavy: Vec<_> = (0..2).map(|_| turn(&cpu, "heavy")).collect();
            for t in &heavy {
                at_once("the heavy tenant alone: both workers", t.take()).await;
            }
            // A walk of at least a second of the store's work (1 ms per object found), as a
            // heavy invocation's host call.
            let (walker, pace) = (
                Arc::clone(&heavy[0]),
                Arc::clone(&heavy[0]) as Arc<dyn Pace>,
            );
            let walk = tokio::spawn(async move {
                let keep = Arc::new(|_: &str| {
                    std::thread::sleep(Duration::from_millis(1));
                    true
                });
                walker
                    .hold(store.list("b", "", 10_000, 100_000, keep, (Some(&pace), None)))
                    .await
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(cpu.load("heavy"), (2, 0), "the walk holds its slot");
            // The light tenant comes, within its share: at its next tick the walk, over its
            // tenant's share now, gives its slot up and waits for its turn.
            let light = turn(&cpu, "light");
            at_once("the light tenant within its share", light.take()).await;
            let gave = async {
                while cpu.load("heavy") != (1, 1) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            };
            let gave = tokio::time::timeout(Duration::from_millis(150), gave).await;
            assert!(
                gave.is_ok(),
                "the walk gave its slot up at a tick: {:?}",
                cpu.load("heavy")
            );
            assert!(!walk.is_finished(), "while it still had work");
            // It waits off the blocking thread: other blocking work runs meanwhile.
            let shares = Arc::clone(&cpu);
            let other = tokio::task::spawn_blocking(move || shares.load("heavy"));
            let other = tokio::time::timeout(Duration::from_secs(5), other).await;
            assert!(
                matches!(other, Ok(Ok((1, 1)))),
                "the walk held the blocking thread while it waited for its turn: {other:?}"
            );
            light.give();
            let listed = walk.await.expect("walk").expect("list");
            assert_eq!(listed.len(), 1000);
            assert_eq!(cpu.load("heavy"), (2, 0), "held again after the call");
        });
    }

    #[test]
    fn the_local_stores_work_stops_at_its_invocations_deadline() {
        multi_thread().block_on(async {
            let (_dir, store) = thousand_objects();
            let cpu = CpuShares::new(2);
            let until = Instant::now() + Duration::from_millis(50);
            let t = Turn::new(&cpu, "t", 1, until);
            at_once("a slot", t.take()).await;
            // A walk of at least a second (1 ms per object found), counting its work past the
            // deadline.
            let late = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = Arc::clone(&late);
            let keep = Arc::new(move |_: &str| {
                std::thread::sleep(Duration::from_millis(1));
                if Instant::now() >= until {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                true
            });
            let pace = Arc::clone(&t) as Arc<dyn Pace>;
            let walk = t.hold(store.list("b", "", 10_000, 100_000, keep, (Some(&pace), None)));
            let r = walk.await;
            let late = late.load(std::sync::atomic::Ordering::Relaxed);
            assert!(
                matches!(&r, Err(ObjectError::Stopped(m)) if m.contains("time is up")),
                "{r:?}"
            );
            // A tick and a step past it at most (10 ms at 1 ms an object), with room for a
            // slow machine; unpaced, the walk would go on for every object left.
            assert!(late < 100, "{late} objects looked at past the deadline");
        });
    }

    #[test]
    fn a_wait_dropped_or_past_its_deadline_gives_its_place_back() {
        rt().block_on(async {
            let cpu = CpuShares::new(1);
            let (a, b) = (turn(&cpu, "t"), turn(&cpu, "t"));
            at_once("a", a.take()).await;
            assert!(
                tokio::time::timeout(Duration::from_millis(20), b.take())
                    .await
                    .is_err()
            );
            assert_eq!(cpu.load("t"), (1, 0), "the dropped wait is not counted");
            let late = Turn::new(&cpu, "t", 1, Instant::now() + Duration::from_millis(15));
            assert!(!late.take().await, "no slot before its deadline");
            assert_eq!(cpu.load("t"), (1, 0));
            drop(a);
            assert_eq!(cpu.load("t"), (0, 0), "a dropped turn gives its slot back");
            at_once("free now", b.take()).await;
        });
    }

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl Count {
        fn get(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// Polls `f` once with a waker of its own: its wakes, and whether it was ready.
    fn poll_counted<F: Future>(f: std::pin::Pin<&mut F>) -> (Arc<Count>, bool) {
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let ready = f.poll(&mut Context::from_waker(&waker)).is_ready();
        (count, ready)
    }

    #[test]
    fn a_slot_given_back_wakes_each_tenants_first_waiting_invocation_only() {
        let rt = rt();
        // Entered, not run: the backstop's timers are registered and never fire, so every wake
        // counted is the shares'.
        let _entered = rt.enter();
        let cpu = CpuShares::new(2);
        // Each tenant holds its share, one worker, and has invocations waiting.
        let (holder, light) = (turn(&cpu, "heavy"), turn(&cpu, "light"));
        let (mut h, mut l) = (Box::pin(holder.take()), Box::pin(light.take()));
        assert!(poll_counted(h.as_mut()).1 && poll_counted(l.as_mut()).1);
        let heavy: Vec<_> = (0..3).map(|_| turn(&cpu, "heavy")).collect();
        let mut waits: Vec<_> = heavy.iter().map(|t| Box::pin(t.take())).collect();
        let light2 = turn(&cpu, "light");
        let mut light_wait = Box::pin(light2.take());
        let counts: Vec<Arc<Count>> = waits
            .iter_mut()
            .map(|w| {
                let (c, ready) = poll_counted(w.as_mut());
                assert!(!ready, "over its share");
                c
            })
            .collect();
        let (light_count, ready) = poll_counted(light_wait.as_mut());
        assert!(!ready, "over its share");
        assert_eq!((cpu.load("heavy"), cpu.load("light")), ((1, 3), (1, 1)));
        let woken = |counts: &[Arc<Count>]| counts.iter().map(|c| c.get()).collect::<Vec<_>>();
        holder.give();
        assert_eq!(
            (woken(&counts), light_count.get()),
            (vec![1, 0, 0], 1),
            "the first of each tenant's waiting invocations, and no other"
        );
        // The heavy tenant's first takes the worker, and the next comes first: woken to look.
        assert!(
            poll_counted(waits[0].as_mut()).1,
            "the heavy tenant's share"
        );
        assert_eq!(woken(&counts), vec![1, 1, 0], "the new first, only");
        // It looks and waits; when it goes (its deadline, its request gone), the next comes
        // first and is woken.
        assert!(!poll_counted(waits[1].as_mut()).1, "no worker free");
        drop(waits.remove(1));
        assert_eq!(woken(&counts), vec![1, 1, 1]);
        assert_eq!(cpu.load("heavy"), (1, 1));
        assert!(
            !poll_counted(light_wait.as_mut()).1,
            "the light tenant's share is held"
        );
    }
}
