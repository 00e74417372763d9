//! An invocation's deadline: its time limit counted from when it started, wherever it is (in
//! the guest, in a host call, waiting for the device).
//!
//! The one exception is the host's own one-off work that a call happens to wait for, the first
//! load of a model package and the measurement of its memory model: while a call waits for it
//! the deadline is held ([`Deadline::hold`]), and the time is credited afterwards, up to
//! [`MAX_CREDIT`] per invocation, since no tenant causes it twice.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Most host time one invocation is credited (first loads and measurements of its models).
pub const MAX_CREDIT: Duration = Duration::from_secs(120);

/// When an invocation must end.
#[derive(Debug)]
pub struct Deadline {
    started: Instant,
    limit: Duration,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    credit: Duration,
    /// Holds in force, and since when.
    holds: u32,
    since: Option<Instant>,
}

/// Holds a deadline while it lives (the host's own work): the time is credited when the last
/// hold ends.
#[derive(Debug)]
pub struct Hold<'a>(&'a Deadline);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let mut h = self.0.lock();
        h.holds -= 1;
        if h.holds == 0
            && let Some(since) = h.since.take()
        {
            h.credit = (h.credit + since.elapsed()).min(MAX_CREDIT);
        }
    }
}

/// A wait that ran into its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("time limit of {limit:?} exceeded")]
pub struct Expired {
    pub limit: Duration,
}

impl Deadline {
    pub fn new(limit: Duration) -> Self {
        Self::starting_at(Instant::now(), limit)
    }

    pub fn starting_at(started: Instant, limit: Duration) -> Self {
        Self {
            started,
            limit,
            held: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the deadline until the guard is dropped (the host's own one-off work); the time
    /// is then credited. A deadline already past stays past.
    pub fn hold(&self) -> Hold<'_> {
        let mut h = self.lock();
        h.holds += 1;
        if h.since.is_none() {
            h.since = Some(Instant::now());
        }
        Hold(self)
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Host time credited so far.
    pub fn credited(&self) -> Duration {
        self.lock().credit
    }

    /// The instant the invocation must have ended by (moving with the clock while held, up
    /// to [`MAX_CREDIT`]).
    pub fn at(&self) -> Instant {
        let h = self.lock();
        let holding = h.since.map_or(Duration::ZERO, |s| s.elapsed());
        self.started + self.limit + (h.credit + holding).min(MAX_CREDIT)
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.at()
    }

    pub fn remaining(&self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }

    pub fn check(&self) -> Result<(), Expired> {
        if self.expired() {
            Err(self.error())
        } else {
            Ok(())
        }
    }

    pub fn error(&self) -> Expired {
        Expired { limit: self.limit }
    }

    /// Moves the deadline by `d` of the host's own time (up to [`MAX_CREDIT`] in all).
    pub fn credit(&self, d: Duration) {
        let mut h = self.lock();
        h.credit = (h.credit + d).min(MAX_CREDIT);
    }

    /// Runs `f` until it finishes or the deadline passes (following any credit granted while
    /// it runs); on expiry `f` is dropped, which cancels it.
    pub async fn run<F: Future>(&self, f: F) -> Result<F::Output, Expired> {
        self.run_past(f, Duration::ZERO).await
    }

    /// Like [`Deadline::run`], but gives `f` `grace` past the deadline: for an outer guard, so
    /// that the checks inside `f` (which say where the time ran out) come first.
    pub async fn run_past<F: Future>(&self, f: F, grace: Duration) -> Result<F::Output, Expired> {
        let mut f = std::pin::pin!(f);
        loop {
            let at = self.at() + grace;
            tokio::select! {
                out = &mut f => return Ok(out),
                () = tokio::time::sleep_until(at.into()) => {
                    if Instant::now() >= self.at() + grace {
                        return Err(self.error());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_ends_at_the_deadline_and_credit_moves_it() {
        let d = Deadline::new(Duration::from_millis(50));
        let started = Instant::now();
        let r = d.run(tokio::time::sleep(Duration::from_secs(5))).await;
        assert_eq!(
            r,
            Err(Expired {
                limit: Duration::from_millis(50)
            })
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(45) && took < Duration::from_millis(500),
            "{took:?}"
        );

        let d = Deadline::new(Duration::from_millis(50));
        d.credit(Duration::from_millis(100));
        assert_eq!(
            d.run(tokio::time::sleep(Duration::from_millis(100))).await,
            Ok(())
        );
        d.credit(Duration::from_secs(1_000_000));
        assert_eq!(d.credited(), MAX_CREDIT, "credit is capped");

        // While held, the deadline does not pass; the time held is credited.
        let d = Deadline::new(Duration::from_millis(50));
        let waited = {
            let _hold = d.hold();
            d.run(tokio::time::sleep(Duration::from_millis(200))).await
        };
        assert_eq!(waited, Ok(()));
        assert!(d.credited() >= Duration::from_millis(200));
        assert!(!d.expired());
    }
}
