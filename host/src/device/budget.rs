//! The device's memory budget: weights of loaded models and reservations of running batches.
//!
//! A model's weights are charged when it is loaded, before any compute, and stay charged while
//! it is loaded. A model in use (a [`Pin`]: a compute call or a profile holding it) stays;
//! an idle one is unloaded, least recently used first, when another model or a batch needs the
//! room. A model whose weights and one sample cannot fit the budget at all is refused.
//!
//! Residency is shared fairly between tenants. A model a tenant used within `resident_for` is
//! that tenant's (a model several used is theirs in equal parts). A load for one tenant unloads
//! another's model only while that other holds more than its share of the budget (the budget
//! divided by the tenants that used a model within `resident_for`, the loader included): a
//! tenant that loads model after model unloads its own, not a neighbour's, and each of `n`
//! active tenants keeps `1/n` of the budget resident. A batch unloads only models nobody used
//! within `resident_for`, unless not even one sample would fit without the others.

use crate::account::Deadline;
use crate::device::types::DeviceError;
use crate::models::Models;
use hapi_model::ModelPackage;
use hapi_wire::profile::ModelMemory;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
    pins: usize,
    last_used: u64,
    /// Tenants that pinned it within `resident_for`, with when they last pinned or unpinned it.
    users: Vec<(Arc<str>, Instant)>,
}

impl Loaded {
    /// Records `tenant`'s use now, and forgets uses older than `window`.
    fn used_by(&mut self, tenant: &Arc<str>, now: Instant, window: Duration) {
        self.users
            .retain(|(t, at)| t != tenant && now.saturating_duration_since(*at) < window);
        self.users.push((Arc::clone(tenant), now));
    }
}

impl Slot {
    fn weights(&self) -> u64 {
        match self {
            Slot::Loading { weights, .. } => *weights,
            Slot::Loaded(l) => l.weights,
        }
    }

    /// The tenants whose model this is now: those that used it within `window` (and any that
    /// hold it pinned); a model being loaded is its loader's.
    fn owners(&self, now: Instant, window: Duration) -> Vec<&str> {
        match self {
            Slot::Loading { tenant, .. } => vec![&**tenant],
            Slot::Loaded(l) => l
                .users
                .iter()
                .filter(|(_, at)| l.pins > 0 || now.saturating_duration_since(*at) < window)
                .map(|(t, _)| &**t)
                .collect(),
        }
    }
}

/// Who needs room, and so which idle models may be unloaded for it.
#[derive(Debug, Clone, Copy)]
enum Claim<'a> {
    /// A load for this tenant: models that are its own, nobody's, or another tenant's over
    /// its share.
    Load(&'a str),
    /// Models nobody used within `resident_for`.
    Stale,
    /// Any idle model.
    Any,
}

#[derive(Debug, Default)]
struct State {
    models: HashMap<String, Slot>,
    /// Weights charged (loaded and loading models).
    weights: u64,
    reserved: u64,
    peak: u64,
    clock: u64,
    evictions: u64,
    loads: u64,
    /// Loads that waited because other tenants' models, within their shares, held the room.
    kept: u64,
    resident_for: Duration,
}

impl State {
    fn used(&self) -> u64 {
        self.weights + self.reserved
    }

    fn note_peak(&mut self) {
        self.peak = self.peak.max(self.used());
    }

    /// Bytes of the budget that `tenant` holds in models (its share of each model it uses),
    /// not counting the models in `gone`.
    fn holding(&self, tenant: &str, gone: &[&str], now: Instant) -> u64 {
        self.models
            .iter()
            .filter(|(name, _)| !gone.contains(&name.as_str()))
            .map(|(_, s)| {
                let owners = s.owners(now, self.resident_for);
                if owners.contains(&tenant) {
                    s.weights() / owners.len() as u64
                } else {
                    0
                }
            })
            .sum()
    }

    /// Whether `model` stays for a load for `loader`: another tenant whose model it is holds
    /// no more than its share of the budget (the models in `gone` unloaded).
    fn kept_from(
        &self,
        model: &Slot,
        loader: &str,
        gone: &[&str],
        total: u64,
        now: Instant,
    ) -> bool {
        let others: Vec<&str> = model
            .owners(now, self.resident_for)
            .into_iter()
            .filter(|t| *t != loader)
            .collect();
        if others.is_empty() {
            return false;
        }
        let mut active: Vec<&str> = self
            .models
            .iter()
            .filter(|(name, _)| !gone.contains(&name.as_str()))
            .flat_map(|(_, s)| s.owners(now, self.resident_for))
            .chain(std::iter::once(loader))
            .collect();
        active.sort_unstable();
        active.dedup();
        let share = total / active.len() as u64;
        others.iter().any(|t| self.holding(t, gone, now) <= share)
    }

    /// How long until the next use of a model passes `resident_for` (at least 1 ms).
    fn next_expiry(&self, now: Instant) -> Duration {
        self.models
            .values()
            .filter_map(|s| match s {
                Slot::Loaded(l) => Some(l.users.iter()),
                Slot::Loading { .. } => None,
            })
            .flatten()
            .map(|(_, at)| {
                self.resident_for
                    .saturating_sub(now.saturating_duration_since(*at))
            })
            .filter(|d| !d.is_zero())
            .min()
            .unwrap_or(self.resident_for)
            .max(Duration::from_millis(1))
    }

    /// The idle models to unload, least recently used first, so that `need` bytes are free
    /// for `claim`; `None` when unloading all it may unload would not free enough (then none
    /// is: a waiter that cannot fit yet must not empty the device of others' models).
    fn plan(&self, total: u64, need: u64, claim: Claim<'_>, now: Instant) -> Option<Vec<String>> {
        let mut free = total.saturating_sub(self.used());
        let mut gone: Vec<&str> = Vec::new();
        while free < need {
            let (name, weights) = self
                .models
                .iter()
                .filter(|(name, _)| !gone.contains(&name.as_str()))
                .filter(|(_, s)| matches!(s, Slot::Loaded(l) if l.pins == 0))
                .filter(|(_, s)| match claim {
                    Claim::Load(loader) => !self.kept_from(s, loader, &gone, total, now),
                    Claim::Stale => s.owners(now, self.resident_for).is_empty(),
                    Claim::Any => true,
                })
                .filter_map(|(name, s)| match s {
                    Slot::Loaded(l) => Some((l.last_used, name.as_str(), l.weights)),
                    Slot::Loading { .. } => None,
                })
                .min()
                .map(|(_, name, weights)| (name, weights))?;
            free += weights;
            gone.push(name);
        }
        Some(gone.into_iter().map(String::from).collect())
    }

    /// Unloads idle models (as [`Self::plan`] picks them for `claim`) until `need` bytes are
    /// free; returns whether they are.
    fn make_room(&mut self, total: u64, need: u64, claim: Claim<'_>, now: Instant) -> bool {
        let Some(victims) = self.plan(total, need, claim, now) else {
            return false;
        };
        for name in victims {
            if let Some(slot) = self.models.remove(&name) {
                self.weights -= slot.weights();
                self.evictions += 1;
                tracing::info!(
                    "unloaded model `{name}` ({} bytes of weights) to make room",
                    slot.weights()
                );
            }
        }
        true
    }

    /// Bytes free now, or once the idle models are unloaded (with `stale`, only those nobody
    /// used within `resident_for`).
    fn room(&self, total: u64, stale: bool, now: Instant) -> u64 {
        let idle: u64 = self
            .models
            .values()
            .filter(|s| {
                matches!(s, Slot::Loaded(l) if l.pins == 0)
                    && (!stale || s.owners(now, self.resident_for).is_empty())
            })
            .map(Slot::weights)
            .sum();
        total.saturating_sub(self.used()) + idle
    }
}

/// What [`Budget::try_pin`] found.
enum Attempt {
    Pinned(Pin),
    Load,
    Loading,
    /// No room yet. `kept`: other tenants' models within their shares hold it, until at most
    /// this long from now (when the next use of a model passes `resident_for`, shares
    /// change without anything else waking the waiter).
    NoRoom {
        kept: Option<Duration>,
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
}

/// A loaded model held in use: it cannot be unloaded until every pin is dropped.
#[derive(Debug)]
pub struct Pin {
    budget: Arc<Budget>,
    name: String,
    tenant: Arc<str>,
    pub model: Arc<ModelPackage>,
    pub memory: Arc<ModelMemory>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut s = lock(&self.budget.state);
        s.clock += 1;
        let (tick, window) = (s.clock, s.resident_for);
        if let Some(Slot::Loaded(l)) = s.models.get_mut(&self.name) {
            l.pins -= 1;
            l.last_used = tick;
            l.used_by(&self.tenant, Instant::now(), window);
        }
        drop(s);
        self.budget.wake();
    }
}

/// Bytes of the budget held until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.budget.state).reserved -= self.bytes;
        self.budget.wake();
    }
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
    pub kept: u64,
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
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    fn wake(&self) {
        self.changed.notify_all();
        self.notify.notify_waiters();
    }

    pub fn snapshot(&self) -> BudgetSnapshot {
        let s = lock(&self.state);
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
            kept: s.kept,
        }
    }

    /// Pins model `name` for `tenant`, loading it first (weights charged, idle models it may
    /// unload unloaded to make room) if it is not loaded. Waits for room while other calls or
    /// other tenants' models hold it, until `deadline`; the time the load itself takes is
    /// credited to the deadline (the host's own work).
    pub async fn acquire(
        self: &Arc<Self>,
        models: &Arc<Models>,
        name: &str,
        tenant: &Arc<str>,
        deadline: &Deadline,
    ) -> Result<Pin, DeviceError> {
        let weights = models
            .weights(name)
            .ok_or_else(|| DeviceError::TooLarge(format!("no model `{name}` on this host")))?;
        if weights > self.total {
            return Err(DeviceError::TooLarge(format!(
                "model `{name}` has {weights} bytes of weights; the device budget is {}",
                self.total
            )));
        }
        // Counted once per call in `kept`.
        let mut deferred = false;
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
            match self.try_pin(name, weights, tenant) {
                Attempt::Pinned(pin) => return Ok(pin),
                Attempt::Load => {
                    // The load finishes (and its slot is settled) even if this caller gives up
                    // at its deadline; a later call finds the model loaded.
                    let load = self.start_load(models, name, weights);
                    match deadline.run(load).await {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Ok(Err(e))) => return Err(e),
                        Ok(Err(e)) => {
                            return Err(DeviceError::Failed(format!("loading worker: {e}")));
                        }
                        Err(_) => return Err(loading()),
                    }
                }
                Attempt::Loading => {
                    if deadline.run(notified).await.is_err() {
                        return Err(loading());
                    }
                }
                Attempt::NoRoom { kept } => {
                    if kept.is_some() && !deferred {
                        deferred = true;
                        lock(&self.state).kept += 1;
                    }
                    let changed = async {
                        match kept {
                            Some(expiry) => {
                                let _ = tokio::time::timeout(expiry, notified).await;
                            }
                            None => notified.await,
                        }
                    };
                    if deadline.run(changed).await.is_err() {
                        let held = if kept.is_some() {
                            format!(
                                "other tenants' models hold it (a model a tenant used within \
                                 the last {:?} stays while the tenant holds no more than its \
                                 share of the {} byte budget)",
                                lock(&self.state).resident_for,
                                self.total
                            )
                        } else {
                            "other calls hold it".to_string()
                        };
                        return Err(DeviceError::Busy(format!(
                            "model `{name}` ({weights} bytes of weights) could not be loaded \
                             within the time limit: the device's memory is full and {held}; \
                             retry later"
                        )));
                    }
                }
            }
        }
    }

    /// Pins `name` for `tenant` if it is loaded; otherwise claims its load if there is room
    /// (its weights charged, idle models the tenant may unload unloaded), or says to wait.
    fn try_pin(self: &Arc<Self>, name: &str, weights: u64, tenant: &Arc<str>) -> Attempt {
        let mut s = lock(&self.state);
        s.clock += 1;
        let (tick, window, now) = (s.clock, s.resident_for, Instant::now());
        match s.models.get_mut(name) {
            Some(Slot::Loaded(l)) => {
                l.pins += 1;
                l.last_used = tick;
                l.used_by(tenant, now, window);
                Attempt::Pinned(Pin {
                    budget: Arc::clone(self),
                    name: name.to_string(),
                    tenant: Arc::clone(tenant),
                    model: Arc::clone(&l.package),
                    memory: Arc::clone(&l.memory),
                })
            }
            Some(Slot::Loading { .. }) => Attempt::Loading,
            None => {
                if s.make_room(self.total, weights, Claim::Load(tenant), now) {
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
                    Attempt::Load
                } else {
                    // Other tenants' models hold the room if it would be there were they
                    // anyone's to unload.
                    let kept = s
                        .plan(self.total, weights, Claim::Any, now)
                        .map(|_| s.next_expiry(now));
                    Attempt::NoRoom { kept }
                }
            }
        }
    }

    /// Loads `name` (its slot is `Loading`, its weights charged) on a blocking thread, which
    /// settles the slot when done: loaded (idle, unpinned) or gone with its weights uncharged.
    fn start_load(
        self: &Arc<Self>,
        models: &Arc<Models>,
        name: &str,
        weights: u64,
    ) -> tokio::task::JoinHandle<Result<(), DeviceError>> {
        let (budget, m, n) = (Arc::clone(self), Arc::clone(models), name.to_string());
        tokio::task::spawn_blocking(move || {
            let loaded = m.load(&n).and_then(|package| {
                let memory = m.memory(&n, &package)?;
                Ok((Arc::new(package), memory))
            });
            budget.settle(&n, weights, loaded)
        })
    }

    /// Records the outcome of a load.
    fn settle(
        &self,
        name: &str,
        weights: u64,
        loaded: Result<(Arc<ModelPackage>, Arc<ModelMemory>), String>,
    ) -> Result<(), DeviceError> {
        let mut s = lock(&self.state);
        let loader = match s.models.get(name) {
            Some(Slot::Loading { tenant, .. }) => Some(Arc::clone(tenant)),
            _ => None,
        };
        let result = match loaded {
            Ok((package, memory)) => {
                let first = memory.one_sample_peak();
                if weights + first > self.total {
                    Err(DeviceError::TooLarge(format!(
                        "model `{name}` needs {weights} bytes of weights and {first} to run one \
                         sample; the device budget is {}",
                        self.total
                    )))
                } else {
                    s.clock += 1;
                    let tick = s.clock;
                    let now = Instant::now();
                    s.models.insert(
                        name.to_string(),
                        Slot::Loaded(Loaded {
                            package,
                            memory,
                            weights,
                            pins: 0,
                            last_used: tick,
                            users: loader.into_iter().map(|t| (t, now)).collect(),
                        }),
                    );
                    Ok(())
                }
            }
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

    /// The most a batch of `model` could ever reserve: the budget less its own weights.
    pub fn ceiling(&self, model_weights: u64) -> u64 {
        self.total.saturating_sub(model_weights)
    }

    /// Bytes a batch could reserve now, unloading idle models nobody used within
    /// `resident_for`; or, if that leaves less than `one` (a sample's run), any idle model.
    pub fn room_for(&self, one: u64) -> u64 {
        let s = lock(&self.state);
        let now = Instant::now();
        let stale = s.room(self.total, true, now);
        if stale >= one {
            stale
        } else {
            s.room(self.total, false, now)
        }
    }

    /// Reserves `need` bytes now (unloading idle models nobody used within `resident_for`
    /// if that makes room, else any idle ones), or `None`.
    pub fn reserve_now(self: &Arc<Self>, need: u64) -> Option<Reservation> {
        let mut s = lock(&self.state);
        let now = Instant::now();
        if !s.make_room(self.total, need, Claim::Stale, now)
            && !s.make_room(self.total, need, Claim::Any, now)
        {
            return None;
        }
        s.reserved += need;
        s.note_peak();
        Some(Reservation {
            budget: Arc::clone(self),
            bytes: need,
        })
    }

    /// Reserves `need` bytes (unloading idle models if that makes room), waiting while other
    /// calls hold the memory, until `deadline`. `what` names the work in the errors.
    pub async fn reserve(
        self: &Arc<Self>,
        need: u64,
        deadline: &Deadline,
        what: &str,
    ) -> Result<Reservation, DeviceError> {
        if need > self.total {
            return Err(DeviceError::TooLarge(format!(
                "{what} needs {need} bytes of device memory; the device budget is {}",
                self.total
            )));
        }
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = self.reserve_now(need) {
                return Ok(r);
            }
            if deadline.run(notified).await.is_err() {
                return Err(DeviceError::Busy(format!(
                    "{what} found no room for {need} bytes of device memory within the time \
                     limit: it is held by other calls; retry later"
                )));
            }
        }
    }

    /// Waits (blocking) until the budget changes or `timeout` passes.
    pub fn wait_changed(&self, timeout: Duration) {
        let s = lock(&self.state);
        let _ = self
            .changed
            .wait_timeout(s, timeout)
            .unwrap_or_else(PoisonError::into_inner);
    }
}
