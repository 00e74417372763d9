//! An invocation's deadline: its time limit counted from when it started, wherever it is (in
//! the guest, in a host call, waiting for the device or for a model to load). Nothing is
//! credited: a call never outlives its limit. A wait the host causes (a model's first load, no
//! room on the device) that runs into the deadline is answered as backpressure (429
//! `device_busy` with `Retry-After`), not as the tenant's time limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Whether the caller waiting for a blocking job has gone away (its invocation stopped at its
/// deadline, or abandoned by its client). A blocking task cannot be aborted, so the job looks
/// at this between its steps; [`Cancel::on_drop`] sets it when the caller's future goes.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// A guard that cancels when dropped (after the job finished: no matter).
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// Sets its [`Cancel`] when dropped.
#[derive(Debug)]
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        (self.0).0.store(true, Ordering::Release);
    }
}

/// When an invocation must end.
#[derive(Debug)]
pub struct Deadline {
    started: Instant,
    limit: Duration,
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
        Self { started, limit }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// The instant the invocation must have ended by.
    pub fn at(&self) -> Instant {
        self.started + self.limit
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.at()
    }

    pub fn remaining(&self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }

    pub fn error(&self) -> Expired {
        Expired { limit: self.limit }
    }

    /// Runs `f` until it finishes or the deadline passes; on expiry `f` is dropped, which
    /// cancels it.
    pub async fn run<F: Future>(&self, f: F) -> Result<F::Output, Expired> {
        self.run_past(f, Duration::ZERO).await
    }

    /// Like [`Deadline::run`], but gives `f` `grace` past the deadline: for an outer guard, so
    /// that the checks inside `f` (which say where the time ran out) come first.
    pub async fn run_past<F: Future>(&self, f: F, grace: Duration) -> Result<F::Output, Expired> {
        tokio::time::timeout_at((self.at() + grace).into(), f)
            .await
            .map_err(|_| self.error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_ends_at_the_deadline() {
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
        let d = Deadline::new(Duration::from_millis(200));
        assert_eq!(
            d.run(tokio::time::sleep(Duration::from_millis(10))).await,
            Ok(())
        );
        assert!(!d.expired());
    }
}
