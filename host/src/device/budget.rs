//! The device's memory budget: weights of loaded models and reservations of running batches.
//!
//! A model's weights are charged when it is loaded, before any compute, and stay charged while
//! it is loaded. A model in use (a [`Pin`]: a compute call or a profile holding it) stays;
//! an idle one is unloaded, least recently used first, when another model or a batch needs the
//! room. A model whose weights and one sample cannot fit the budget at all is refused.
//!
//! Residency is shared fairly between tenants. A model a tenant holds pinned, or used within
//! `resident_for`, is that tenant's (a model several use is theirs in equal parts). Room for a
//! tenant (its load, a batch it leads, its profile) comes from models nobody used within
//! `resident_for`, from the tenant's own, and from those of tenants holding more than their
//! share of the budget (the budget divided by the tenants that own a model, the claimant
//! included), in that order, least recently used first within each; never from a model of a
//! tenant within its share. A tenant that loads model after model unloads its own, not a
//! neighbour's. A claim that cannot be met that way waits (woken when a use grows stale) until
//! its deadline, a batch's too (the dispatcher passes over a leader that cannot get one
//! sample's room, rather than hold up every tenant's batches behind it). A load or reservation
//! that waits for the room running batches hold has it left free by all other work once they
//! end, the oldest such wait first among those the batches' ending could still meet and whose
//! waiter takes the room within [`LOOK_GRACE`] of its being there ([`Waiting`]). A tenant
//! loads one model at a time: a load
//! goes on after its caller has gone, and the tenant's next load waits for it.

use crate::account::{Deadline, Pace};
use crate::device::types::DeviceError;
use crate::locks::lock;
use crate::models::Models;
use hapi_model::ModelPackage;
use hapi_wire::profile::ModelMemory;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The budget's state, locked: when let go, it wakes the waiters if a wait's grace began
/// meanwhile ([`State::grace_started`]).
struct Locked<'a> {
    state: MutexGuard<'a, State>,
    budget: &'a Budget,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if std::mem::take(&mut self.state.grace_started) {
            // Notifying under the lock: the woken take it once it is let go.
            self.budget.wake_all();
        }
    }
}

#[derive(Debug)]
enum Slot {
    /// Being loaded for `tenant`; others wait for it.
    Loading {
        tenant: Arc<str>,
        weights: u64,
    },
    Loaded(Loaded),
}

#[derive(Debug)]
struct Loaded {
    package: Arc<ModelPackage>,
    memory: Arc<ModelMemory>,
    weights: u64,
    /// Pins of all tenants.
    pins: usize,
    last_used: u64,
    /// Tenants that hold it pinned or used it within `resident_for`.
    users: Vec<User>,
}

/// A tenant's use of a model: its pins now, and when it last pinned or unpinned it.
#[derive(Debug)]
struct User {
    tenant: Arc<str>,
    pins: usize,
    at: Instant,
}

impl User {
    fn owns(&self, now: Instant, window: Duration) -> bool {
        self.pins > 0 || now.saturating_duration_since(self.at) < window
    }
}

impl Loaded {
    /// Records a pin by `tenant` now, and forgets uses that own nothing any more.
    fn pin(&mut self, tenant: &Arc<str>, now: Instant, window: Duration) {
        self.users
            .retain(|u| u.tenant == *tenant || u.owns(now, window));
        match self.users.iter_mut().find(|u| u.tenant == *tenant) {
            Some(u) => {
                u.pins += 1;
                u.at = now;
            }
            None => self.users.push(User {
                tenant: Arc::clone(tenant),
                pins: 1,
                at: now,
            }),
        }
        self.pins += 1;
    }

    /// Records that `tenant` dropped a pin now.
    fn unpin(&mut self, tenant: &str, now: Instant) {
        if let Some(u) = self.users.iter_mut().find(|u| &*u.tenant == tenant) {
            u.pins = u.pins.saturating_sub(1);
            u.at = now;
        }
        self.pins = self.pins.saturating_sub(1);
    }
}

impl Slot {
    fn weights(&self) -> u64 {
        match self {
            Slot::Loading { weights, .. } => *weights,
            Slot::Loaded(l) => l.weights,
        }
    }

    /// The tenants whose model this is now: those that hold it pinned or used it within
    /// `window`; a model being loaded is its loader's.
    fn owners(&self, now: Instant, window: Duration) -> Vec<&str> {
        match self {
            Slot::Loading { tenant, .. } => vec![&**tenant],
            Slot::Loaded(l) => l
                .users
                .iter()
                .filter(|u| u.owns(now, window))
                .map(|u| &*u.tenant)
                .collect(),
        }
    }
}

/// Who needs room, and so which idle models may be unloaded for it.
#[derive(Debug, Clone, Copy)]
enum Claim<'a> {
    /// Room for this tenant: models that are nobody's or its own, then those of tenants over
    /// their share.
    For(&'a str),
    /// Models nobody owns.
    Stale,
    /// Any idle model (only to tell why a claim waits: nothing is unloaded for it).
    Any,
}

#[derive(Debug, Default)]
struct State {
    models: HashMap<String, Slot>,
    /// Weights charged (loaded and loading models).
    weights: u64,
    reserved: u64,
    /// Of `reserved`, what running batches hold: each ends within its `slice` or `batch_time`.
    /// The rest (a profile's measurement, a call reserved whole with adaptation off) may be
    /// held for seconds.
    batches: u64,
    peak: u64,
    clock: u64,
    evictions: u64,
    loads: u64,
    /// Loads that waited because other tenants' models, within their shares, held the room.
    deferred: u64,
    resident_for: Duration,
    /// Weights of unloaded models still being freed, beyond the claims that unloaded them
    /// (see [`Unloaded`]).
    freeing: u64,
    /// Looks at the room that found too little and wait for a change (a load or a
    /// reservation that waits, a batch the dispatcher waits for): a pin dropped with no look
    /// since it was taken wakes nobody (see [`Pin`]'s drop). A call refused with adaptation
    /// off waits for nothing and is not counted: each such refusal made the pin it was
    /// refused beside wake every waiter when dropped.
    looked: u64,
    /// Needs of the loads and reservations waiting for the room running batches hold, by id,
    /// oldest first: the oldest one's is left free by all other work (see [`Waiting`]).
    waiting: std::collections::BTreeMap<u64, Wait>,
    next_waiting: u64,
    /// A wait's grace began under the lock now held ([`State::hold`]): the waiters are
    /// woken when it is let go ([`Locked`]), so that the wait's waiter knows to look. A grace
    /// begun at a use that woke nobody (the dispatcher's look, a batch's reservation, a pin
    /// that made the wait before it unmeetable) ran out unseen, and the wait lapsed.
    grace_started: bool,
}

/// A registered wait ([`Waiting`]): what it needs, whose it is, and since when its room has
/// been there for it to take while its waiter has not looked.
#[derive(Debug)]
struct Wait {
    need: u64,
    tenant: Arc<str>,
    /// When its grace began ([`State::hold`]: the first use of the room, other than its own
    /// waiter's attempt, that found it the holder with its room free), cleared when its waiter
    /// looks: not renewed by later
    /// wakes, so that wakes coming faster than [`LOOK_GRACE`] (every batch's end) do not keep
    /// it from running out; and begun only when its room is free for it, so that other
    /// tenants' wakes alone cannot make it run out.
    unseen: Option<Instant>,
    /// Times its grace ran out before its waiter looked ([`MAX_LAPSES`] at most). A wait
    /// that lapsed goes to the back of the line at its waiter's next look, and once it has
    /// lapsed `MAX_LAPSES` times it holds nothing back any more: held again at every look, a
    /// waiter slow to look each time drained the device for its need and left it idle for a
    /// grace at every look, to its deadline.
    lapses: u32,
}

/// Graces ([`LOOK_GRACE`]) a wait may let run out before it holds nothing back: a waiter late
/// once (a busy host) is held for again, behind the waits registered meanwhile; one late at
/// every look costs the others at most this many drains of the device and graces per call.
pub const MAX_LAPSES: u32 = 2;

/// How long a wait's need stays held back from other work once its room is free for it, if
/// its waiter has not looked since. A waiter woken must be scheduled to look, on a slot of its
/// tenant's share (at the front of its tenant's queue, but behind its tenant's other woken
/// host calls, each of which may keep the slot to its next tick): a tenant keeping its other
/// invocations waking and spinning kept the room its wait held back unused by everyone for a
/// tick per invocation, some 0.6 s at a concurrency of 64, at each change. Past this, others
/// may take the room, and the wait holds nothing back until its waiter looks, then again from
/// the back of the line, [`MAX_LAPSES`] times at most (its waiter still takes the room when it
/// looks and finds it free).
pub const LOOK_GRACE: Duration = Duration::from_millis(50);

impl State {
    fn used(&self) -> u64 {
        self.weights + self.reserved + self.freeing
    }

    /// Bytes work leaves free for the wait holding room back ([`Self::holder`]): its need,
    /// unless that wait is `exempt` (the waiting attempt itself); 0 if none. Whether the running
    /// batches ending could still meet a wait (its room may have been pinned since, or time
    /// made a model it counted on another's within its share) is judged here, when the room is
    /// used, so that nothing needs to wake it for that. One wait only: two waits that each
    /// left the other's need free could stop each other to their deadlines. Whoever's
    /// the work, the waiting tenant's own batches included: exempting them let its batches
    /// take the room its own load waited for while everyone else's were cut.
    ///
    /// A use of the room: starts the holder's grace ([`LOOK_GRACE`]) if its room is free for it
    /// now and none is running, unless it is `exempt` (its waiter is looking now: a grace
    /// begun at the waiter's own attempt woke every waiter once for nothing). The holder is
    /// found once: starting a grace never changes which wait holds the room.
    fn hold(&mut self, total: u64, exempt: Option<u64>, now: Instant) -> u64 {
        let Some((id, w, room)) = self.holder(total, now) else {
            return 0;
        };
        if Some(id) == exempt {
            return 0;
        }
        let (need, starts) = (w.need, w.unseen.is_none() && room >= w.need);
        if starts && let Some(w) = self.waiting.get_mut(&id) {
            w.unseen = Some(now);
            self.grace_started = true;
        }
        need
    }

    /// [`Self::hold`] without using the room: no grace begins (a snapshot's figure, a refusal's
    /// reason).
    fn held_back(&self, total: u64, exempt: Option<u64>, now: Instant) -> u64 {
        match self.holder(total, now) {
            Some((id, w, _)) if Some(id) != exempt => w.need,
            _ => 0,
        }
    }

    /// The wait whose need is held back: the oldest whose waiter is still looking and that
    /// the running batches ending would meet. Not merely the oldest: one that holds nothing
    /// (its room pinned since, its waiter gone quiet) left every later wait unprotected. With
    /// its room now ([`Self::room`] for its tenant, the batches not counted).
    fn holder(&self, total: u64, now: Instant) -> Option<(u64, &Wait, u64)> {
        // A tenant's room once the batches end, looked up once however many of its waits come
        // before the holder (each look walks the models).
        let mut rooms: Vec<(&str, u64)> = Vec::new();
        for (id, w) in &self.waiting {
            if !still_looking(w, now) {
                continue;
            }
            let room = match rooms.iter().find(|(t, _)| *t == &*w.tenant) {
                Some((_, room)) => *room,
                None => {
                    let room = self.room(total, Claim::For(&w.tenant), now);
                    rooms.push((&w.tenant, room));
                    room
                }
            };
            if room.saturating_add(self.batches) >= w.need {
                return Some((*id, w, room));
            }
        }
        None
    }

    /// Starts the grace ([`LOOK_GRACE`]) of the wait holding room back, if its room is free
    /// for it now and none is running ([`Self::hold`], no wait exempt): from the first time
    /// anyone but its own waiter uses the room after that (a wake, a batch's reservation, the
    /// dispatcher's look, another wait's end), whichever wait holds it then. A wait becomes the holder without any wake when the one
    /// before it stops holding (its grace ran out); started only at wakes, its grace never
    /// began, and two waits whose waiters were slow each found the room held for the other and
    /// held it from everyone.
    fn start_grace(&mut self, total: u64, now: Instant) {
        self.hold(total, None, now);
    }

    /// How long until the wait holding its need back stops doing so if its waiter does not
    /// look ([`LOOK_GRACE`]), if its room is free now: the later waits may have it then.
    fn next_lapse(&self, total: u64, now: Instant) -> Option<Duration> {
        let (_, w, _) = self.holder(total, now)?;
        let since = w.unseen?;
        Some(
            LOOK_GRACE
                .saturating_sub(now.saturating_duration_since(since))
                .max(Duration::from_millis(1)),
        )
    }

    /// Whether `tenant` would have `need` bytes once the running batches end: its room now and
    /// the batches' memory (what a [`Waiting`] is registered for while true).
    fn batches_would_meet(&self, total: u64, tenant: &str, need: u64, now: Instant) -> bool {
        self.room(total, Claim::For(tenant), now)
            .saturating_add(self.batches)
            >= need
    }

    /// [`Self::room`] for `tenant`'s work, less what it leaves for the wait holding room back
    /// ([`Self::hold`]).
    fn room_left(&mut self, total: u64, tenant: &str, exempt: Option<u64>, now: Instant) -> u64 {
        let held = self.hold(total, exempt, now);
        self.room(total, Claim::For(tenant), now)
            .saturating_sub(held)
    }

    fn note_peak(&mut self) {
        self.peak = self.peak.max(self.used());
    }

    /// How long until the next use of a model passes `resident_for` (at least 1 ms); `None`
    /// when no use will (none unpinned is within it: with no window, none ever is), since
    /// time alone then changes nothing, and a waiter looked every 1 ms while a neighbour's pin
    /// was held, each look a refusal that made the pin's drop wake every waiter.
    fn next_expiry(&self, now: Instant) -> Option<Duration> {
        self.models
            .values()
            .filter_map(|s| match s {
                Slot::Loaded(l) => Some(l.users.iter()),
                Slot::Loading { .. } => None,
            })
            .flatten()
            .filter(|u| u.pins == 0)
            .map(|u| {
                self.resident_for
                    .saturating_sub(now.saturating_duration_since(u.at))
            })
            .filter(|d| !d.is_zero())
            .min()
            .map(|d| d.max(Duration::from_millis(1)))
    }

    /// The idle models to unload for `claim` until `need` bytes are free, in the order
    /// [`Claim`] gives, least recently used first within it; and the bytes free once they are.
    /// Stops early when nothing more may be unloaded (the bytes are then less than `need`).
    fn victims(&self, total: u64, need: u64, claim: Claim<'_>, now: Instant) -> (Vec<String>, u64) {
        let mut free = total.saturating_sub(self.used());
        let entries: Vec<(&String, &Slot, Vec<&str>)> = self
            .models
            .iter()
            .map(|(name, s)| (name, s, s.owners(now, self.resident_for)))
            .collect();
        let mut gone = vec![false; entries.len()];
        let mut victims = Vec::new();
        while free < need {
            // What each owner holds (its part of each model it owns) and its share, over the
            // models not yet picked.
            let mut holding: HashMap<&str, u64> = HashMap::new();
            if let Claim::For(claimant) = claim {
                holding.insert(claimant, 0);
                for (i, (_, s, owners)) in entries.iter().enumerate() {
                    if gone[i] {
                        continue;
                    }
                    for t in owners {
                        *holding.entry(t).or_default() += s.weights() / owners.len() as u64;
                    }
                }
            }
            let share = total / holding.len().max(1) as u64;
            let over = |t: &&str| holding.get(t).is_some_and(|h| *h > share);
            let pick = entries
                .iter()
                .enumerate()
                .filter(|(i, _)| !gone[*i])
                .filter_map(|(i, (_, s, owners))| {
                    let Slot::Loaded(l) = s else {
                        return None;
                    };
                    if l.pins > 0 {
                        return None;
                    }
                    let class = match claim {
                        Claim::Any => 0,
                        Claim::Stale if owners.is_empty() => 0,
                        Claim::Stale => return None,
                        Claim::For(claimant) => {
                            let mut others = owners.iter().filter(|t| **t != claimant).peekable();
                            if others.peek().is_none() {
                                0
                            } else if others.all(over) {
                                1
                            } else {
                                return None;
                            }
                        }
                    };
                    Some((class, l.last_used, i))
                })
                .min();
            let Some((_, _, i)) = pick else {
                break;
            };
            gone[i] = true;
            free += entries[i].1.weights();
            victims.push(entries[i].0.clone());
        }
        (victims, free)
    }

    /// Unloads the idle models [`Self::victims`] picks for `claim` if that frees `need`
    /// bytes, and returns them, to be freed once the lock is let go ([`Budget::free`]); `None`
    /// (and unloads none) if it would not free enough (a waiter that cannot fit yet must not
    /// empty the device of others' models).
    /// Unloads the idle models [`Self::victims`] gives until `need` bytes are free, of which
    /// the claimant charges `charged` at once (the rest is left free for a wait).
    fn make_room(
        &mut self,
        total: u64,
        (need, charged): (u64, u64),
        claim: Claim<'_>,
        now: Instant,
    ) -> Option<Unloaded> {
        let (victims, free) = self.victims(total, need, claim, now);
        if free < need {
            return None;
        }
        let mut unloaded = Unloaded {
            slots: Vec::new(),
            held: 0,
        };
        let mut bytes = 0;
        for name in victims {
            if let Some(slot) = self.models.remove(&name) {
                self.weights -= slot.weights();
                self.evictions += 1;
                bytes += slot.weights();
                tracing::info!(
                    "unloaded model `{name}` ({} bytes of weights) to make room",
                    slot.weights()
                );
                unloaded.slots.push(slot);
            }
        }
        // Until they are freed, the part of their weights beyond what the claimant charges
        // stays counted: no one else takes memory that is still theirs.
        unloaded.held = bytes.saturating_sub(charged);
        self.freeing += unloaded.held;
        Some(unloaded)
    }

    /// When `tenant`'s claim of `need` bytes cannot be met: whether unloading idle models
    /// whoever's would meet it, so that other tenants' models hold the room (it may wait for
    /// the running batches' room as well); not if only running calls hold it, or if the room
    /// is the tenant's but left free for an older wait (that claim waits as a wait for the
    /// batches' room too, and is told why).
    fn kept_for_others(&self, total: u64, tenant: &str, need: u64, now: Instant) -> bool {
        self.room(total, Claim::For(tenant), now) < need
            && self.room(total, Claim::Any, now) >= need
    }

    /// Bytes a claim could have: free now, or once the models it may unload are.
    fn room(&self, total: u64, claim: Claim<'_>, now: Instant) -> u64 {
        self.victims(total, u64::MAX, claim, now).1
    }
}

/// Whether `w`'s waiter is still to be waited for: it has looked since its room was free, or
/// that was within [`LOOK_GRACE`], and it has not lapsed [`MAX_LAPSES`] times. While so, its
/// need is held back.
fn still_looking(w: &Wait, now: Instant) -> bool {
    w.lapses < MAX_LAPSES
        && w.unseen
            .is_none_or(|since| now.saturating_duration_since(since) < LOOK_GRACE)
}

/// Models unloaded to make room, to be freed by the claimant that unloaded them once the
/// budget's lock is let go, before it uses the room ([`Budget::free`]). They were freed under
/// the lock, on the dispatcher or an invocation worker: unmapping hundreds of MiB of weights
/// (tens of ms) stopped every tenant's pins, reservations and finishing batches meanwhile, and
/// a tenant allowed two models that do not fit its share together could unload one for the
/// other at every call. `held`: bytes of their weights beyond the claim, counted in the
/// budget until they are freed.
#[must_use]
struct Unloaded {
    slots: Vec<Slot>,
    held: u64,
}

/// Waits for `notified` (the budget changed), or at most `until` (the next use to grow stale
/// changes what may be unloaded, and nothing wakes the waiter then: where other tenants'
/// models hold the room, or a registered wait counts on room it may take away).
async fn changed(
    until: Option<Duration>,
    notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
) {
    match until {
        Some(expiry) => {
            let _ = tokio::time::timeout(expiry, notified).await;
        }
        None => notified.await,
    }
}

/// What [`Budget::try_pin`] found.
enum Attempt {
    /// Pinned; whether the waiters are to be woken (see [`Budget::try_pin`]).
    Pinned(Pin, bool),
    Load,
    Loading,
    /// The tenant's load of this other model is under way: a tenant loads one at a time.
    Turn(String),
    /// No room yet. `kept`: other tenants' models within their shares hold it (until the
    /// next use of a model passes `resident_for`, when shares change without anything else
    /// waking the waiter).
    NoRoom {
        kept: bool,
    },
}

/// The budget. Blocking waiters (the dispatcher, unpooled device threads) use the condition
/// variable, async ones the notifier.
#[derive(Debug)]
pub struct Budget {
    total: u64,
    state: Mutex<State>,
    changed: Condvar,
    notify: tokio::sync::Notify,
    /// Times the waiters were woken.
    wakes: std::sync::atomic::AtomicU64,
}

/// A loaded model held in use: it cannot be unloaded until every pin is dropped.
#[derive(Debug)]
pub struct Pin {
    budget: Arc<Budget>,
    name: String,
    tenant: Arc<str>,
    pub model: Arc<ModelPackage>,
    pub memory: Arc<ModelMemory>,
    /// [`State::looked`] when it was taken.
    looked: u64,
}

/// A pin dropped makes its model unloadable again, the room others waited for, so it wakes
/// them; but only if one of them looked at the room while it was held. Between a pin and its
/// drop with no look, the room is as it was (the model used since may be picked later among
/// idle models, which the next wake or expiry settles), so nobody's wait was decided by it: a
/// guest calling `load-by-name` on a loaded model in a loop (a pin and its drop each) woke
/// every waiting load and reservation, and the dispatcher, on each call. A pin that makes its
/// tenant one of the model's owners shrinks every owner's share, which may put another owner
/// over its own and make its idle models unloadable, room a waiter may take: the waiters are
/// woken when it is taken ([`Budget::acquire`]), not when it is dropped, which may be seconds
/// later. (The dispatcher's wait after a pass that found no room, at most 2 ms, or 5 ms with
/// pooling off, counts as a look only once it begins: a drop just before it is missed, and the
/// wait ends without it.)
impl Drop for Pin {
    fn drop(&mut self) {
        let mut s = self.budget.locked();
        s.clock += 1;
        let tick = s.clock;
        if let Some(Slot::Loaded(l)) = s.models.get_mut(&self.name) {
            l.unpin(&self.tenant, Instant::now());
            l.last_used = tick;
        }
        let looked = s.looked != self.looked;
        drop(s);
        if looked {
            self.budget.wake();
        }
    }
}

/// Bytes of the budget held until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
    /// A running batch's.
    batch: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut s = self.budget.locked();
        s.reserved -= self.bytes;
        if self.batch {
            s.batches -= self.bytes;
        }
        drop(s);
        self.budget.wake();
    }
}

/// A load or reservation waiting for room that running batches hold. The dispatcher starts
/// the next batch within microseconds of one ending, on a thread of its own, while a waiter
/// woken then must be scheduled on an invocation worker (up to a tick, with guests busy) to
/// take the room: a tenant whose model was not loaded lost every such race to a neighbour's
/// batches and was answered `device_busy` at each call's deadline. While this is held, the
/// oldest waiter's need is left free by all other work (batches, loads, reservations, its own
/// tenant's included), so that it has the room once the batches running now end, as long as
/// its waiter takes the room within [`LOOK_GRACE`] of its being free. Registered only while those
/// batches ending would give it the room; dropped when the wait ends.
#[derive(Debug)]
struct Waiting {
    budget: Arc<Budget>,
    id: u64,
}

impl Drop for Waiting {
    /// Wakes the waiters if this wait held room back: any other's removal changes no one's
    /// room (each wait that ended woke every waiter, a wake storm a tenant could repeat). A
    /// wait whose own claim took its room holds nothing by then, yet the claim may have freed
    /// the next holder's room (models unloaded that it could not unload): that holder's grace
    /// begins here, and [`Locked`] wakes the waiters for it; otherwise it saw its room free
    /// only at its own timer or the next change.
    fn drop(&mut self) {
        let held = {
            let mut s = self.budget.locked();
            let now = Instant::now();
            let held = s
                .holder(self.budget.total, now)
                .is_some_and(|(id, ..)| id == self.id);
            s.waiting.remove(&self.id);
            if !held {
                s.start_grace(self.budget.total, now);
            }
            held
        };
        if held {
            self.budget.wake();
        }
    }
}

/// The id of the wait `waiting` holds, which its own attempts are exempt from.
fn exempt(waiting: &Option<Waiting>) -> Option<u64> {
    waiting.as_ref().map(|w| w.id)
}

/// The budget's state, for metrics and the profile endpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct BudgetSnapshot {
    pub total: u64,
    pub weights: u64,
    pub reserved: u64,
    pub peak: u64,
    pub loaded: u64,
    pub evictions: u64,
    pub loads: u64,
    pub deferred: u64,
    /// Times the budget's waiters were woken.
    pub wakes: u64,
    /// Loads and reservations waiting for the room running batches hold ([`Waiting`]).
    pub waiting: u64,
    /// Bytes other work leaves free now for the one holding room back ([`State::held_back`]).
    pub held_back: u64,
}

impl Budget {
    /// A budget of `total` bytes; a model a tenant used within `resident_for` is kept for it
    /// within its share (module docs).
    pub fn new(total: u64, resident_for: Duration) -> Arc<Self> {
        Arc::new(Self {
            total,
            state: Mutex::new(State {
                resident_for,
                ..State::default()
            }),
            changed: Condvar::new(),
            notify: tokio::sync::Notify::new(),
            wakes: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Frees models [`State::make_room`] unloaded, outside the lock, on the claimant's thread
    /// before it uses the room; then gives back what of their weights was still counted.
    fn free(&self, unloaded: Unloaded) {
        let Unloaded { slots, held } = unloaded;
        if slots.is_empty() {
            return;
        }
        drop(slots);
        if held > 0 {
            self.locked().freeing -= held;
            self.wake();
        }
    }

    fn wake(&self) {
        {
            let mut s = self.locked();
            s.start_grace(self.total, Instant::now());
            // Woken below.
            s.grace_started = false;
        }
        self.wake_all();
    }

    /// Wakes every waiter (blocking and async) to look at the room again.
    fn wake_all(&self) {
        self.wakes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.changed.notify_all();
        self.notify.notify_waiters();
    }

    /// The state, locked ([`Locked`]).
    fn locked(&self) -> Locked<'_> {
        Locked {
            state: lock(&self.state),
            budget: self,
        }
    }

    pub fn snapshot(&self) -> BudgetSnapshot {
        let s = self.locked();
        BudgetSnapshot {
            total: self.total,
            weights: s.weights,
            reserved: s.reserved,
            peak: s.peak,
            loaded: s
                .models
                .values()
                .filter(|m| matches!(m, Slot::Loaded(_)))
                .count() as u64,
            evictions: s.evictions,
            loads: s.loads,
            deferred: s.deferred,
            wakes: self.wakes.load(std::sync::atomic::Ordering::Relaxed),
            waiting: s.waiting.len() as u64,
            held_back: s.held_back(self.total, None, Instant::now()),
        }
    }

    /// Pins model `name` for `tenant`, loading it first (weights charged, idle models it may
    /// unload unloaded to make room) if it is not loaded. Waits for room while other calls or
    /// other tenants' models hold it, until `deadline`, which counts the load's own time too
    /// (past it, a load under way answers as backpressure). A load is CPU work for `tenant`: it
    /// begins once `pace` lets it (a slot of the tenant's share of the workers, held until the
    /// load ends and `pace` is dropped), or not at all if `pace` says the caller's time is up
    /// (the tenant's own work held its share: [`DeviceError::Expired`]).
    pub async fn acquire(
        self: &Arc<Self>,
        models: &Arc<Models>,
        name: &str,
        tenant: &Arc<str>,
        deadline: &Deadline,
        pace: Option<Arc<dyn Pace>>,
    ) -> Result<Pin, DeviceError> {
        let mut pace = pace;
        let weights = models
            .weights(name)
            .ok_or_else(|| DeviceError::TooLarge(format!("no model `{name}` on this host")))?;
        if weights > self.total {
            return Err(DeviceError::TooLarge(format!(
                "model `{name}` has {weights} bytes of weights; the device budget is {}",
                self.total
            )));
        }
        // Once its memory model is known (its first load measured it), a model whose weights
        // fit but not beside one sample's run is refused before it is loaded again: each call
        // would otherwise unload idle models, charge its weights and read it from disk, only
        // to be refused once it was loaded.
        if let Some(memory) = models.memory_known(name) {
            self.fits_one_sample(name, weights, &memory)?;
        }
        // Counted once per call in `deferred`.
        let mut counted = false;
        let mut waiting = None;
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let loading = || {
                DeviceError::Busy(format!(
                    "model `{name}` is being loaded on this host (its first use, or after it \
                     was unloaded to make room); retry shortly"
                ))
            };
            self.looking(&mut waiting);
            match self.try_pin(name, weights, tenant, exempt(&waiting)) {
                Attempt::Pinned(pin, wake) => {
                    if wake {
                        self.wake();
                    }
                    return Ok(pin);
                }
                Attempt::Load => {
                    // Its weights are charged: nothing is left free for it any more.
                    drop(waiting.take());
                    // Its `Loading` slot makes the tenant one of its owners, as a new owner's
                    // pin does (see [`Pin`]'s drop): loads are few, each paced and charged.
                    self.wake();
                    // The load finishes (and its slot is settled) even if this caller gives up
                    // at its deadline; a later call finds the model loaded. It comes pinned
                    // for this caller (the pin is dropped with the result if the caller is
                    // gone), so that nobody unloads it before the caller runs on it.
                    let load = self.start_load(
                        models,
                        name,
                        weights,
                        tenant,
                        pace.take(),
                        deadline.limit(),
                    );
                    match deadline.run(load).await {
                        Ok(Ok(Ok(pin))) => return Ok(pin),
                        Ok(Ok(Err(e))) => return Err(e),
                        Ok(Err(e)) => {
                            return Err(DeviceError::Failed(format!("loading worker: {e}")));
                        }
                        Err(_) => return Err(loading()),
                    }
                }
                Attempt::Loading => {
                    // Another's load of it: its weights are charged, no room is needed.
                    drop(waiting.take());
                    if deadline.run(notified).await.is_err() {
                        return Err(loading());
                    }
                }
                Attempt::Turn(other) => {
                    // Waiting for the tenant's own load, not for room.
                    drop(waiting.take());
                    if deadline.run(notified).await.is_err() {
                        return Err(DeviceError::Busy(format!(
                            "model `{name}` was not loaded within the time limit: tenant \
                             `{tenant}` loads one model at a time, and its load of `{other}` \
                             was still under way; retry shortly"
                        )));
                    }
                }
                Attempt::NoRoom { kept } => {
                    if kept && !counted {
                        counted = true;
                        self.locked().deferred += 1;
                    }
                    let until = self.wait_for_batches(&mut waiting, tenant, weights, kept);
                    if deadline.run(changed(until, notified)).await.is_err() {
                        return Err(DeviceError::Busy(format!(
                            "model `{name}` ({weights} bytes of weights) could not be loaded \
                             within the time limit: {}; retry later",
                            self.held_by(kept, (&**tenant, weights), exempt(&waiting))
                        )));
                    }
                }
            }
        }
    }

    /// Pins `name` for `tenant` if it is loaded; otherwise claims its load if there is room
    /// (its weights charged, idle models the tenant may unload unloaded), or says to wait.
    fn try_pin(
        self: &Arc<Self>,
        name: &str,
        weights: u64,
        tenant: &Arc<str>,
        exempt: Option<u64>,
    ) -> Attempt {
        let mut s = self.locked();
        s.clock += 1;
        let (tick, window, now, looked) = (s.clock, s.resident_for, Instant::now(), s.looked);
        match s.models.get_mut(name) {
            Some(Slot::Loaded(l)) => {
                // An idle model pinned may be room the oldest wait counted on: the wait then
                // holds nothing back ([`State::hold`] judges it when it is used), and
                // nobody is woken for it. Waking the waiters for it let a tenant pinning such
                // a model in a loop wake every waiter of the host at each pin.
                // With no window, a use owns nothing once its pin is dropped: a pin's ownership
                // lasts only while it is held, and every pin of a loop would wake the waiters.
                let new_owner = !window.is_zero()
                    && !l
                        .users
                        .iter()
                        .any(|u| u.tenant == *tenant && u.owns(now, window));
                l.pin(tenant, now, window);
                l.last_used = tick;
                let pin = Pin {
                    budget: Arc::clone(self),
                    name: name.to_string(),
                    tenant: Arc::clone(tenant),
                    model: Arc::clone(&l.package),
                    memory: Arc::clone(&l.memory),
                    looked,
                };
                // A new owner shrinks every share (see [`Pin`]'s drop).
                Attempt::Pinned(pin, new_owner)
            }
            Some(Slot::Loading { .. }) => Attempt::Loading,
            None => {
                // One load at a time per tenant: loads run on blocking threads and go on after
                // their caller has gone, so without this a tenant could keep as many running
                // as it may use models.
                let mine = s.models.iter().find_map(|(other, slot)| match slot {
                    Slot::Loading { tenant: t, .. } if t == tenant => Some(other.clone()),
                    _ => None,
                });
                if let Some(other) = mine {
                    return Attempt::Turn(other);
                }
                // Leaving what the wait holding room back needs free.
                let need = weights.saturating_add(s.hold(self.total, exempt, now));
                let claim = Claim::For(tenant);
                if let Some(unloaded) = s.make_room(self.total, (need, weights), claim, now) {
                    s.weights += weights;
                    s.loads += 1;
                    s.note_peak();
                    s.models.insert(
                        name.to_string(),
                        Slot::Loading {
                            tenant: Arc::clone(tenant),
                            weights,
                        },
                    );
                    drop(s);
                    self.free(unloaded);
                    Attempt::Load
                } else {
                    // The caller waits for a change.
                    s.looked += 1;
                    Attempt::NoRoom {
                        kept: s.kept_for_others(self.total, tenant, weights, now),
                    }
                }
            }
        }
    }

    /// Loads `name` for `tenant` (its slot is `Loading`, its weights charged) on a blocking
    /// thread, once `pace` lets it begin (else [`DeviceError::Expired`] at `limit`), which
    /// settles the slot when done: loaded and pinned for `tenant`, or gone with its weights
    /// uncharged. Its wait for `pace` holds no blocking thread.
    fn start_load(
        self: &Arc<Self>,
        models: &Arc<Models>,
        name: &str,
        weights: u64,
        tenant: &Arc<str>,
        pace: Option<Arc<dyn Pace>>,
        limit: Duration,
    ) -> tokio::task::JoinHandle<Result<Pin, DeviceError>> {
        use futures::FutureExt;
        let (budget, m, n) = (Arc::clone(self), Arc::clone(models), name.to_string());
        let tenant = Arc::clone(tenant);
        tokio::spawn(async move {
            // A panic in the pace or the load must still settle the slot: a slot left
            // `Loading` would keep its weights charged and the tenant's loads waiting for ever.
            // The load is one libtorch call, paced once: it runs on a slot of the tenant's
            // share (held by `pace` until it is dropped below), or not at all.
            let begin = std::panic::AssertUnwindSafe(async {
                match &pace {
                    None => true,
                    Some(p) => match p.try_pace() {
                        Some(go) => go,
                        None => p.turn().await,
                    },
                }
            })
            .catch_unwind()
            .await;
            match begin {
                Ok(true) => {}
                Ok(false) => {
                    // Settled as a failed load (its weights uncharged), answered as the time
                    // limit it ran into.
                    let _failed = budget.settle(&n, weights, &tenant, Err("not begun".into()));
                    return Err(DeviceError::Expired(limit));
                }
                Err(panic) => {
                    let e = format!(
                        "the load's pace panicked: {}",
                        crate::account::text::panic_message(panic.as_ref())
                    );
                    return budget.settle(&n, weights, &tenant, Err(e));
                }
            }
            let settling = Arc::clone(&budget);
            let (n2, tenant2) = (n.clone(), Arc::clone(&tenant));
            let loading = tokio::task::spawn_blocking(move || {
                let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    m.load(&n).and_then(|package| {
                        let memory = m.memory(&n, &package)?;
                        Ok((Arc::new(package), memory))
                    })
                }))
                .unwrap_or_else(|panic| {
                    Err(format!(
                        "the load panicked: {}",
                        crate::account::text::panic_message(panic.as_ref())
                    ))
                });
                drop(pace);
                budget.settle(&n, weights, &tenant, loaded)
            });
            match loading.await {
                Ok(settled) => settled,
                // Never run (the host shutting down): the slot is settled here.
                Err(e) if e.is_cancelled() => {
                    settling.settle(&n2, weights, &tenant2, Err(format!("loading worker: {e}")))
                }
                Err(e) => Err(DeviceError::Failed(format!("loading worker: {e}"))),
            }
        })
    }

    /// Records the outcome of a load for `tenant`: the model pinned for it, or the error.
    fn settle(
        self: &Arc<Self>,
        name: &str,
        weights: u64,
        tenant: &Arc<str>,
        loaded: Result<(Arc<ModelPackage>, Arc<ModelMemory>), String>,
    ) -> Result<Pin, DeviceError> {
        let mut s = self.locked();
        let result = match loaded {
            Ok((package, memory)) => self.fits_one_sample(name, weights, &memory).map(|()| {
                s.clock += 1;
                let (tick, window) = (s.clock, s.resident_for);
                let pin = Pin {
                    budget: Arc::clone(self),
                    name: name.to_string(),
                    tenant: Arc::clone(tenant),
                    model: Arc::clone(&package),
                    memory: Arc::clone(&memory),
                    looked: s.looked,
                };
                let mut loaded = Loaded {
                    package,
                    memory,
                    weights,
                    pins: 0,
                    last_used: tick,
                    users: Vec::new(),
                };
                loaded.pin(tenant, Instant::now(), window);
                s.models.insert(name.to_string(), Slot::Loaded(loaded));
                pin
            }),
            Err(e) => Err(DeviceError::Failed(format!("loading model `{name}`: {e}"))),
        };
        if result.is_err() {
            s.models.remove(name);
            s.weights -= weights;
        }
        drop(s);
        self.wake();
        result
    }

    /// Whether `name`'s weights and one sample's run fit the budget at all.
    fn fits_one_sample(
        &self,
        name: &str,
        weights: u64,
        memory: &ModelMemory,
    ) -> Result<(), DeviceError> {
        let first = memory.one_sample_peak();
        if weights.saturating_add(first) > self.total {
            return Err(DeviceError::TooLarge(format!(
                "model `{name}` needs {weights} bytes of weights and {first} to run one sample; \
                 the device budget is {}",
                self.total
            )));
        }
        Ok(())
    }

    /// The most a batch of `model` could ever reserve: the budget less its own weights.
    pub fn ceiling(&self, model_weights: u64) -> u64 {
        self.total.saturating_sub(model_weights)
    }

    /// Bytes a batch led by `tenant` could reserve now: free, or once the models nobody owns
    /// are unloaded; if that leaves less than `one` (a sample's run), once the models
    /// [`Claim::For`] `tenant` allows are. Never by unloading a model another tenant keeps
    /// within its share: a leader that cannot have one sample's room by these rules is passed
    /// over (see the dispatcher) and waits for those models to go stale, as a load does.
    pub fn room_for(&self, one: u64, tenant: &str) -> u64 {
        let mut s = self.locked();
        let now = Instant::now();
        let held = s.hold(self.total, None, now);
        let stale = s.room(self.total, Claim::Stale, now).saturating_sub(held);
        if stale >= one {
            return stale;
        }
        s.room(self.total, Claim::For(tenant), now)
            .saturating_sub(held)
    }

    /// Bytes a batch led by `tenant` could have once the running batches give their memory
    /// back and the models it may claim are unloaded: what waiting for the running batches can
    /// give it. Not what profiles and calls reserved whole hold: the dispatcher, waiting for
    /// that, would have held every tenant's batches up behind a measurement of seconds.
    pub fn room_once_reservations_end(&self, tenant: &str) -> u64 {
        let mut s = self.locked();
        s.room_left(self.total, tenant, None, Instant::now())
            .saturating_add(s.batches)
    }

    /// Bytes `tenant` could claim now: free, or once the models [`Claim::For`] it allows are
    /// unloaded.
    pub fn room_of(&self, tenant: &str) -> u64 {
        self.locked()
            .room_left(self.total, tenant, None, Instant::now())
    }

    /// Reserves `need` bytes now for work led by `tenant`, unloading the models [`Claim::For`]
    /// `tenant` allows (those nobody owns first: their last use is older than any owned one's);
    /// or `None`.
    pub fn reserve_now(self: &Arc<Self>, need: u64, tenant: &str) -> Option<Reservation> {
        self.reserve_held(need, tenant, (false, false), None)
    }

    /// [`Self::reserve_now`] for a batch the dispatcher runs (see
    /// [`Self::room_once_reservations_end`]); a refusal counts as a look ([`State::looked`]):
    /// the dispatcher waits for a change after it.
    pub fn reserve_batch(self: &Arc<Self>, need: u64, tenant: &str) -> Option<Reservation> {
        self.reserve_held(need, tenant, (true, true), None)
    }

    /// [`Self::reserve_now`]; `waits`: the caller waits for a change if it fails
    /// ([`State::looked`]); `exempt`: the caller's own wait ([`State::hold`]).
    fn reserve_held(
        self: &Arc<Self>,
        need: u64,
        tenant: &str,
        (batch, waits): (bool, bool),
        exempt: Option<u64>,
    ) -> Option<Reservation> {
        let mut s = self.locked();
        let now = Instant::now();
        let room = (need.saturating_add(s.hold(self.total, exempt, now)), need);
        let Some(unloaded) = s.make_room(self.total, room, Claim::For(tenant), now) else {
            if waits {
                s.looked += 1;
            }
            return None;
        };
        s.reserved += need;
        if batch {
            s.batches += need;
        }
        s.note_peak();
        drop(s);
        self.free(unloaded);
        Some(Reservation {
            budget: Arc::clone(self),
            bytes: need,
            batch,
        })
    }

    /// Reserves `need` bytes for `tenant` (as [`Self::reserve_now`]), waiting while other
    /// calls or other tenants' models hold the memory, until `deadline`. `what` names the work
    /// in the errors.
    pub async fn reserve(
        self: &Arc<Self>,
        need: u64,
        tenant: &str,
        deadline: &Deadline,
        what: &str,
    ) -> Result<Reservation, DeviceError> {
        self.until_room((need, tenant), deadline, what, |exempt| {
            self.reserve_held(need, tenant, (false, true), exempt)
        })
        .await
    }

    /// Waits, as [`Self::reserve`] does, until `tenant` could claim `need` bytes, or `done`
    /// (asked at each change) says it needs none, and holds nothing: for work that takes its
    /// turn only once there is room.
    pub async fn wait_room(
        self: &Arc<Self>,
        need: u64,
        tenant: &str,
        deadline: &Deadline,
        what: &str,
        done: impl Fn() -> bool,
    ) -> Result<(), DeviceError> {
        self.until_room((need, tenant), deadline, what, |exempt| {
            let mut s = self.locked();
            if s.room_left(self.total, tenant, exempt, Instant::now()) >= need || done() {
                return Some(());
            }
            s.looked += 1;
            None
        })
        .await
    }

    /// Tries `attempt` each time the budget changes until it gives something, or `deadline`.
    async fn until_room<T>(
        self: &Arc<Self>,
        (need, tenant): (u64, &str),
        deadline: &Deadline,
        what: &str,
        attempt: impl Fn(Option<u64>) -> Option<T>,
    ) -> Result<T, DeviceError> {
        if need > self.total {
            return Err(DeviceError::TooLarge(format!(
                "{what} needs {need} bytes of device memory; the device budget is {}",
                self.total
            )));
        }
        let mut waiting = None;
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            self.looking(&mut waiting);
            if let Some(done) = attempt(exempt(&waiting)) {
                return Ok(done);
            }
            let kept = {
                let s = self.locked();
                s.kept_for_others(self.total, tenant, need, Instant::now())
            };
            let until = self.wait_for_batches(&mut waiting, tenant, need, kept);
            if deadline.run(changed(until, notified)).await.is_err() {
                return Err(DeviceError::Busy(format!(
                    "{what} found no room for {need} bytes of device memory within the time \
                     limit: {}; retry later",
                    self.held_by(kept, (tenant, need), exempt(&waiting))
                )));
            }
        }
    }

    /// Keeps `waiting` (`tenant`'s wait for `need` bytes, [`Waiting`]) registered while the
    /// running batches ending would give it the room: registered when they first would, and
    /// dropped when they no longer would (the room they counted on was pinned since, say), so
    /// that no wait that cannot be met holds everyone's work back to its deadline. Whether
    /// other tenants' models hold the room too (`kept`) does not matter: such a wait was left
    /// unregistered, and the dispatcher took the room of each batch that ended for the next
    /// before its waiter could look, to its deadline, whenever a neighbour kept a model in use.
    /// Returns how long the waiter may wait before it looks again unless woken: while it is
    /// registered or other tenants' models hold its room, until the next use grows stale,
    /// since time alone changes the room (an owner's use growing stale grows the other owners'
    /// shares, and a model a wait counted on as held beyond its owner's share is within it
    /// then) and nothing wakes it; and while registered, until the wait holding room back
    /// stops doing so (its waiter quiet past `LOOK_GRACE`), if that is sooner.
    fn wait_for_batches(
        self: &Arc<Self>,
        waiting: &mut Option<Waiting>,
        tenant: &str,
        need: u64,
        kept: bool,
    ) -> Option<Duration> {
        let mut s = self.locked();
        let now = Instant::now();
        s.start_grace(self.total, now);
        // A look (as the refused attempt before it was): a pin taken since that attempt, and
        // held now, wakes the waiters when dropped. Counted only at the attempt, a pin taken
        // between the two made the next use to grow stale none (its only use pinned), and its
        // drop, seeing no look, woke nobody: the waiter slept past the use growing stale.
        s.looked += 1;
        let met = s.batches_would_meet(self.total, tenant, need, now);
        let expiry = (met || kept).then(|| s.next_expiry(now)).flatten();
        let lapse = met.then(|| s.next_lapse(self.total, now)).flatten();
        let until = expiry.into_iter().chain(lapse).min();
        match (met, waiting.is_some()) {
            (true, false) => {
                let id = s.next_waiting;
                s.next_waiting += 1;
                let w = Wait {
                    need,
                    tenant: Arc::from(tenant),
                    unseen: None,
                    lapses: 0,
                };
                s.waiting.insert(id, w);
                *waiting = Some(Waiting {
                    budget: Arc::clone(self),
                    id,
                });
            }
            (false, true) => {
                // Its drop takes the lock.
                drop(s);
                *waiting = None;
            }
            (true, true) | (false, false) => {}
        }
        until
    }

    /// `waiting`'s waiter looks at the room: its grace ([`LOOK_GRACE`]) ends. If the grace had
    /// run out, the wait has lapsed: it goes to the back of the line, or, at its
    /// [`MAX_LAPSES`]th lapse, holds nothing back from then on. Before its attempt, so that the
    /// attempt is exempt from its own hold: after it, a waiter whose grace had run out was
    /// refused for the room held for the wait behind it, then held the room back again
    /// itself, and the two each waited for the other.
    fn looking(&self, waiting: &mut Option<Waiting>) {
        let Some(w) = waiting.as_mut() else {
            return;
        };
        let mut s = self.locked();
        let Some(wait) = s.waiting.get_mut(&w.id) else {
            return;
        };
        let Some(since) = wait.unseen.take() else {
            return;
        };
        if since.elapsed() < LOOK_GRACE || wait.lapses >= MAX_LAPSES {
            return;
        }
        wait.lapses += 1;
        if wait.lapses < MAX_LAPSES
            && let Some(wait) = s.waiting.remove(&w.id)
        {
            let id = s.next_waiting;
            s.next_waiting += 1;
            s.waiting.insert(id, wait);
            w.id = id;
        }
    }

    /// Why `tenant`'s claim of `need` bytes waits, for its error (`own`: its own wait, if
    /// registered).
    fn held_by(&self, kept: bool, (tenant, need): (&str, u64), own: Option<u64>) -> String {
        let models = || {
            format!(
                "other tenants' models, each tenant within its share of the {} byte budget (a \
                 model stays its tenant's while in use and for {:?} after)",
                self.total,
                self.locked().resident_for
            )
        };
        if kept && own.is_none() {
            format!("the device's memory is held by {}", models())
        } else if kept {
            format!(
                "the device's memory is held by running calls, and by {}",
                models()
            )
        } else {
            let s = self.locked();
            let now = Instant::now();
            let room = s.room(self.total, Claim::For(tenant), now);
            if room >= need && s.held_back(self.total, own, now) > 0 {
                "the device's memory it would take is left free for another call that waits \
                 for the memory running calls hold"
                    .to_string()
            } else {
                "the device's memory is held by running calls".to_string()
            }
        }
    }

    /// Waits (blocking) until the budget changes or `timeout` passes.
    pub fn wait_changed(&self, timeout: Duration) {
        let mut s = lock(&self.state);
        s.looked += 1;
        let _ = self
            .changed
            .wait_timeout(s, timeout)
            .unwrap_or_else(PoisonError::into_inner);
    }
}
