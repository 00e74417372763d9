//! Which host a request goes to, and what a failure does to a host.
//!
//! Each host has a measured time per key (an exponentially weighted mean over its answers) and
//! a count of requests outstanding on it. A request goes to the host with the least
//! `(outstanding + 1) x time per key`, ties in turn; a host not yet measured counts as fast as
//! the fastest measured one, so that it gets its share and is measured. A host whose request
//! failed (connection refused or reset, a body cut short, 5xx) is ejected: no request goes to it
//! for a backoff (0.5 s, doubling with each failure in a row, at most 30 s); then a `/healthz`
//! probe decides whether it returns (its time per key measured again) or stays out for the
//! next, longer, backoff. A host that did not answer before another host answered the same
//! request (a hedge, see [`crate::StorageClient::call`]) counts as failed too, and its time per
//! key as at least what it had taken.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// First ejection's length; each failure in a row doubles it.
pub const EJECT_FIRST: Duration = Duration::from_millis(500);
/// Longest ejection.
pub const EJECT_MAX: Duration = Duration::from_secs(30);
/// How long a `/healthz` probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Weight of the newest answer in a host's time per key.
const EWMA: f64 = 0.3;

/// What the client knows of one host.
#[derive(Clone, Debug, Default)]
struct HostState {
    outstanding: usize,
    /// Seconds per key of its answers (weighted mean); `None` until it answers.
    per_key_s: Option<f64>,
    /// Seconds per answer, whatever its size (weighted mean): with several requests on one
    /// host at once, a request waits for those ahead of it (its link, its device), so a small
    /// one takes about as long as a large one.
    per_request_s: Option<f64>,
    /// Failures in a row.
    failures: u32,
    ejected_until: Option<Instant>,
    probing: bool,
    answered: u64,
    failed: u64,
    ejections: u64,
    last_failure: Option<String>,
}

/// One host's record, for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct HostStats {
    pub host: String,
    /// Requests it answered (successes).
    pub answered: u64,
    /// Requests that failed there (including hedges it lost).
    pub failed: u64,
    /// Times it was ejected.
    pub ejections: u64,
    /// Its measured time per key, in seconds.
    pub per_key_s: Option<f64>,
    /// Whether it is out now (ejected, or waiting for its probe).
    pub ejected: bool,
    pub last_failure: Option<String>,
}

/// The hosts and their state, shared with the probes.
#[derive(Debug)]
pub(crate) struct Router {
    hosts: Vec<String>,
    state: Arc<Mutex<Vec<HostState>>>,
    turn: AtomicUsize,
    hedges: AtomicU64,
}

/// A request outstanding on host `index`; counted off when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    pub index: usize,
    state: Arc<Mutex<Vec<HostState>>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        s[self.index].outstanding = s[self.index].outstanding.saturating_sub(1);
    }
}

/// Where the next attempt goes.
pub(crate) enum Pick {
    Host(Lease),
    /// Every host is out: try again at this instant (a probe may bring one back sooner).
    Wait(Instant),
}

fn lock(state: &Mutex<Vec<HostState>>) -> MutexGuard<'_, Vec<HostState>> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (EJECT_FIRST * 2u32.pow(doublings)).min(EJECT_MAX)
}

impl Router {
    pub(crate) fn new(hosts: Vec<String>) -> Router {
        let state = vec![HostState::default(); hosts.len()];
        Router {
            hosts,
            state: Arc::new(Mutex::new(state)),
            turn: AtomicUsize::new(0),
            hedges: AtomicU64::new(0),
        }
    }

    pub(crate) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The host in with the fewest requests outstanding (a side request's target).
    pub(crate) fn least_outstanding(&self) -> usize {
        let s = lock(&self.state);
        (0..s.len())
            .min_by_key(|&i| (s[i].ejected_until.is_some(), s[i].outstanding, i))
            .unwrap_or(0)
    }

    pub(crate) fn host(&self, index: usize) -> &str {
        &self.hosts[index]
    }

    /// The host for the next attempt, other than `avoid`; among `prefer` (the hosts beside the
    /// request's data) when one of them is in, else among all; starts the probes that are due.
    pub(crate) fn pick(
        &self,
        http: &reqwest::Client,
        avoid: Option<usize>,
        prefer: &[usize],
    ) -> Pick {
        let now = Instant::now();
        let mut s = lock(&self.state);
        for (i, h) in s.iter_mut().enumerate() {
            if h.ejected_until.is_some_and(|t| t <= now) && !h.probing {
                h.probing = true;
                self.probe(http, i);
            }
        }
        let fastest = s
            .iter()
            .filter_map(|h| h.per_key_s)
            .min_by(f64::total_cmp)
            .unwrap_or(0.0);
        let n = s.len();
        let first = self.turn.fetch_add(1, Ordering::Relaxed);
        let cost = |i: usize| (s[i].outstanding + 1) as f64 * s[i].per_key_s.unwrap_or(fastest);
        let least = |preferred_only: bool| {
            (0..n)
                .map(|k| (first + k) % n)
                .filter(|&i| Some(i) != avoid && s[i].ejected_until.is_none())
                .filter(|i| !preferred_only || prefer.contains(i))
                .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
        };
        let best = least(!prefer.is_empty()).or_else(|| least(false));
        match best {
            Some(i) => {
                s[i].outstanding += 1;
                Pick::Host(Lease {
                    index: i,
                    state: Arc::clone(&self.state),
                })
            }
            None => {
                let soonest = s
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| Some(i) != avoid)
                    .filter_map(|(_, h)| h.ejected_until)
                    .min()
                    .unwrap_or(now);
                // A probe under way answers within its timeout.
                Pick::Wait(soonest.max(now).min(now + PROBE_TIMEOUT))
            }
        }
    }

    /// Checks `/healthz` of host `i` in the background: back in, or out for longer.
    fn probe(&self, http: &reqwest::Client, i: usize) {
        let url = format!("{}/healthz", self.hosts[i]);
        let http = http.clone();
        let state = Arc::clone(&self.state);
        tokio::spawn(async move {
            let ok = match http.get(&url).timeout(PROBE_TIMEOUT).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("/healthz answered {}", r.status())),
                Err(e) => Err(format!("/healthz: {}", crate::error_chain(&e))),
            };
            let mut s = lock(&state);
            let h = &mut s[i];
            h.probing = false;
            match ok {
                Ok(()) => {
                    h.ejected_until = None;
                    h.failures = 0;
                    // It may have restarted, or recovered: measure it again.
                    h.per_key_s = None;
                    h.per_request_s = None;
                }
                Err(why) => {
                    h.failures += 1;
                    h.ejected_until = Some(Instant::now() + backoff(h.failures));
                    h.last_failure = Some(why);
                }
            }
        });
    }

    /// Host `i` answered `keys` keys in `wall`.
    pub(crate) fn answered(&self, i: usize, keys: usize, wall: Duration) {
        let mut s = lock(&self.state);
        let h = &mut s[i];
        let x = wall.as_secs_f64() / keys.max(1) as f64;
        h.per_key_s = Some(h.per_key_s.map_or(x, |m| m + EWMA * (x - m)));
        let w = wall.as_secs_f64();
        h.per_request_s = Some(h.per_request_s.map_or(w, |m| m + EWMA * (w - m)));
        h.failures = 0;
        h.answered += 1;
    }

    /// Host `i` failed a request: it is ejected for the next backoff.
    pub(crate) fn failed(&self, i: usize, why: &str) {
        let mut s = lock(&self.state);
        let h = &mut s[i];
        h.failed += 1;
        h.failures += 1;
        h.last_failure = Some(why.to_string());
        if h.ejected_until.is_none() && !h.probing {
            h.ejections += 1;
        }
        h.ejected_until = Some(Instant::now() + backoff(h.failures));
    }

    /// Host `i` had not answered `keys` keys after `waited`, and another host did: it fails,
    /// and its time per key is at least that.
    pub(crate) fn lost_hedge(&self, i: usize, keys: usize, waited: Duration) {
        {
            let mut s = lock(&self.state);
            let x = waited.as_secs_f64() / keys.max(1) as f64;
            let h = &mut s[i];
            h.per_key_s = Some(h.per_key_s.map_or(x, |m| m.max(x)));
        }
        self.failed(
            i,
            &format!(
                "no answer within {:.1} s while another host answered",
                waited.as_secs_f64()
            ),
        );
    }

    /// When a request on host `i` of `keys` keys is late enough to be sent to another host as
    /// well: 4x its usual time for that many keys, or for any request if that is longer (at
    /// least 2 s, at most 60 s); `None` before it has answered
    /// (a cold host loads the model) or when it is the only host.
    pub(crate) fn hedge_after(&self, i: usize, keys: usize) -> Option<Duration> {
        if self.hosts.len() < 2 {
            return None;
        }
        let s = lock(&self.state);
        let per_key = s[i].per_key_s?;
        let usual = (per_key * keys.max(1) as f64).max(s[i].per_request_s.unwrap_or(0.0));
        let t = (4.0 * usual).clamp(2.0, 60.0);
        Some(Duration::from_secs_f64(t))
    }

    pub(crate) fn hedged(&self) {
        self.hedges.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn hedges(&self) -> u64 {
        self.hedges.load(Ordering::Relaxed)
    }

    /// The first host that is not out (for one-off calls such as the profile).
    pub(crate) fn first_in(&self) -> usize {
        let s = lock(&self.state);
        s.iter()
            .position(|h| h.ejected_until.is_none())
            .unwrap_or(0)
    }

    pub(crate) fn stats(&self) -> Vec<HostStats> {
        let s = lock(&self.state);
        self.hosts
            .iter()
            .zip(s.iter())
            .map(|(host, h)| HostStats {
                host: host.clone(),
                answered: h.answered,
                failed: h.failed,
                ejections: h.ejections,
                per_key_s: h.per_key_s,
                ejected: h.ejected_until.is_some() || h.probing,
                last_failure: h.last_failure.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Router {
        Router::new(
            (0..n)
                .map(|i| format!("http://127.0.0.1:{}", 1 + i))
                .collect(),
        )
    }

    fn index(p: Pick) -> usize {
        match p {
            Pick::Host(l) => {
                let i = l.index;
                std::mem::forget(l);
                i
            }
            Pick::Wait(_) => usize::MAX,
        }
    }

    #[test]
    fn backoff_doubles_from_half_a_second_to_thirty() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(7), EJECT_MAX);
        assert_eq!(backoff(1000), EJECT_MAX);
    }

    #[tokio::test]
    async fn a_host_twice_as_fast_gets_about_twice_the_requests_outstanding() {
        let r = hosts(2);
        let http = reqwest::Client::new();
        r.answered(0, 10, Duration::from_millis(100));
        r.answered(1, 10, Duration::from_millis(200));
        // Leases held: the outstanding counts grow as requests pile up.
        let mut on = [0usize; 2];
        let mut leases = Vec::new();
        for _ in 0..30 {
            let Pick::Host(l) = r.pick(&http, None, &[]) else {
                panic!("a host is in")
            };
            on[l.index] += 1;
            leases.push(l);
        }
        assert_eq!(on, [20, 10], "{on:?}");
        drop(leases);
        assert!(lock(&r.state).iter().all(|h| h.outstanding == 0));
    }

    #[tokio::test]
    async fn a_failed_host_gets_nothing_until_its_backoff_ends_and_the_rest_is_shared() {
        let r = hosts(3);
        let http = reqwest::Client::new();
        r.failed(1, "connection refused");
        for _ in 0..12 {
            let i = index(r.pick(&http, None, &[]));
            assert!(i == 0 || i == 2, "picked {i}");
        }
        let st = r.stats();
        assert!(st[1].ejected && st[1].ejections == 1, "{st:?}");
        // All out: wait, no sooner than now and no later than the probe's answer.
        r.failed(0, "reset");
        r.failed(2, "reset");
        match r.pick(&http, None, &[]) {
            Pick::Wait(t) => assert!(t <= Instant::now() + PROBE_TIMEOUT),
            Pick::Host(l) => panic!("picked {}", l.index),
        }
    }

    #[tokio::test]
    async fn a_request_goes_to_a_preferred_host_while_one_is_in_else_anywhere() {
        let r = hosts(3);
        let http = reqwest::Client::new();
        let mut leases = Vec::new();
        for _ in 0..6 {
            // However loaded the preferred hosts get, the others are not chosen.
            let Pick::Host(l) = r.pick(&http, None, &[1, 2]) else {
                panic!("a host is in")
            };
            assert!(l.index == 1 || l.index == 2, "picked {}", l.index);
            leases.push(l);
        }
        r.failed(1, "reset");
        r.failed(2, "reset");
        assert_eq!(
            index(r.pick(&http, None, &[1, 2])),
            0,
            "both preferred are out"
        );
    }

    #[tokio::test]
    async fn a_hedge_lost_makes_a_host_slow_and_out() {
        let r = hosts(2);
        r.answered(0, 4, Duration::from_millis(40));
        assert_eq!(r.hedge_after(0, 4), Some(Duration::from_secs(2)));
        assert_eq!(r.hedge_after(1, 4), None, "not measured yet");
        r.lost_hedge(0, 4, Duration::from_secs(8));
        let st = r.stats();
        assert_eq!(st[0].per_key_s, Some(2.0));
        assert!(st[0].ejected);
        assert_eq!(hosts(1).hedge_after(0, 4), None, "nowhere to hedge");
    }

    #[test]
    fn a_small_request_on_a_busy_host_is_given_as_long_as_its_usual_request() {
        // Requests of 4 keys answered in 3 s each (queued behind others on a shared link): a
        // request of 1 key is not hedged after 4 x 0.75 s but after 4 x 3 s.
        let r = hosts(2);
        for _ in 0..4 {
            r.answered(0, 4, Duration::from_secs(3));
        }
        assert_eq!(r.hedge_after(0, 1), Some(Duration::from_secs(12)));
        assert_eq!(r.hedge_after(0, 8), Some(Duration::from_secs(24)));
    }
}
