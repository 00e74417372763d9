//! The device's memory budget: weights of loaded models and reservations of running batches.
//!
//! A model's weights are charged when it is loaded, before any compute, and stay charged while
//! it is loaded. A model in use (a [`Pin`]: a compute call or a profile holding it) stays;
//! an idle one is unloaded, least recently used first, when another model or a batch needs the
//! room. A model whose weights and one sample cannot fit the budget at all is refused.

use crate::account::Deadline;
use crate::device::types::DeviceError;
use crate::models::Models;
use hapi_model::ModelPackage;
use hapi_wire::profile::ModelMemory;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
enum Slot {
    /// Being loaded by one caller; others wait for it.
    Loading,
    Loaded(Loaded),
}

#[derive(Debug)]
struct Loaded {
    package: Arc<ModelPackage>,
    memory: Arc<ModelMemory>,
    weights: u64,
    pins: usize,
    last_used: u64,
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
}

impl State {
    fn used(&self) -> u64 {
        self.weights + self.reserved
    }

    fn note_peak(&mut self) {
        self.peak = self.peak.max(self.used());
    }

    /// Weights of loaded models nobody uses now (they can be unloaded).
    fn idle_weights(&self) -> u64 {
        self.models
            .values()
            .filter_map(|s| match s {
                Slot::Loaded(l) if l.pins == 0 => Some(l.weights),
                _ => None,
            })
            .sum()
    }

    /// Bytes free now, or once every idle model is unloaded.
    fn room(&self, total: u64) -> u64 {
        total.saturating_sub(self.used()) + self.idle_weights()
    }

    /// Unloads idle models, least recently used first, until `need` bytes are free; returns
    /// whether they are. Unloads none when unloading every idle one would not free enough (a
    /// waiter that cannot fit yet must not empty the device of others' models).
    fn make_room(&mut self, total: u64, need: u64) -> bool {
        if self.room(total) < need {
            return false;
        }
        while total.saturating_sub(self.used()) < need {
            let victim = self
                .models
                .iter()
                .filter_map(|(name, s)| match s {
                    Slot::Loaded(l) if l.pins == 0 => Some((l.last_used, name.clone())),
                    _ => None,
                })
                .min();
            let Some((_, name)) = victim else {
                return false;
            };
            if let Some(Slot::Loaded(l)) = self.models.remove(&name) {
                self.weights -= l.weights;
                self.evictions += 1;
                tracing::info!(
                    "unloaded model `{name}` ({} bytes of weights) to make room",
                    l.weights
                );
            }
        }
        true
    }
}

/// What [`Budget::try_pin`] found.
enum Attempt {
    Pinned(Pin),
    Load,
    Loading,
    NoRoom,
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
    pub model: Arc<ModelPackage>,
    pub memory: Arc<ModelMemory>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut s = lock(&self.budget.state);
        s.clock += 1;
        let now = s.clock;
        if let Some(Slot::Loaded(l)) = s.models.get_mut(&self.name) {
            l.pins -= 1;
            l.last_used = now;
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
}

impl Budget {
    pub fn new(total: u64) -> Arc<Self> {
        Arc::new(Self {
            total,
            state: Mutex::default(),
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
        }
    }

    /// Pins model `name`, loading it first (weights charged, idle models unloaded to make room)
    /// if it is not loaded. Waits for room while other calls hold it, until `deadline`; the
    /// time the load itself takes is credited to the deadline (the host's own work).
    pub async fn acquire(
        self: &Arc<Self>,
        models: &Arc<Models>,
        name: &str,
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
            match self.try_pin(name, weights) {
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
                Attempt::NoRoom => {
                    if deadline.run(notified).await.is_err() {
                        return Err(DeviceError::Busy(format!(
                            "model `{name}` could not be loaded within the time limit: the \
                             device's memory is held by other calls; retry later"
                        )));
                    }
                }
            }
        }
    }

    /// Pins `name` if it is loaded; otherwise claims its load if there is room (its weights
    /// charged, idle models unloaded), or says to wait.
    fn try_pin(self: &Arc<Self>, name: &str, weights: u64) -> Attempt {
        let mut s = lock(&self.state);
        s.clock += 1;
        let now = s.clock;
        match s.models.get_mut(name) {
            Some(Slot::Loaded(l)) => {
                l.pins += 1;
                l.last_used = now;
                Attempt::Pinned(Pin {
                    budget: Arc::clone(self),
                    name: name.to_string(),
                    model: Arc::clone(&l.package),
                    memory: Arc::clone(&l.memory),
                })
            }
            Some(Slot::Loading) => Attempt::Loading,
            None => {
                if s.make_room(self.total, weights) {
                    s.weights += weights;
                    s.note_peak();
                    s.models.insert(name.to_string(), Slot::Loading);
                    Attempt::Load
                } else {
                    Attempt::NoRoom
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
                    let now = s.clock;
                    s.models.insert(
                        name.to_string(),
                        Slot::Loaded(Loaded {
                            package,
                            memory,
                            weights,
                            pins: 0,
                            last_used: now,
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

    /// Bytes a batch could reserve now, unloading idle models if need be.
    pub fn room(&self) -> u64 {
        lock(&self.state).room(self.total)
    }

    /// Reserves `need` bytes now (unloading idle models if that makes room), or `None`.
    pub fn reserve_now(self: &Arc<Self>, need: u64) -> Option<Reservation> {
        let mut s = lock(&self.state);
        if !s.make_room(self.total, need) {
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
