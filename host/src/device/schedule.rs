//! Who runs next on the device, and how much of whose work goes into a batch. Pure functions
//! and state, no threads: the dispatcher calls them.
//!
//! Fair share by device time (start-time fair queueing): each tenant has a virtual time, the
//! device seconds it has used divided by its weight. The tenant with the least virtual time
//! among those with work leads the next batch; a tenant that had no work starts again at the
//! least virtual time of those that have (it cannot save up a burst while idle). Whatever the
//! size of its calls, a tenant's share of device time over a few batches is bounded by its
//! weight, because a batch is bounded in time (a large call is cut into slices) and a tenant
//! that used more waits for the others to catch up.

use std::collections::HashMap;
use std::hash::Hash;

/// Virtual times of the tenants the device has served.
#[derive(Debug)]
pub struct Fair<K> {
    vtime: HashMap<K, f64>,
    /// The floor last seen while someone had work: where a tenant arriving at a quiet device
    /// starts (not at 0, which would give it a head start over one that worked meanwhile).
    clock: f64,
}

impl<K> Default for Fair<K> {
    fn default() -> Self {
        Self {
            vtime: HashMap::new(),
            clock: 0.0,
        }
    }
}

impl<K: Eq + Hash + Clone> Fair<K> {
    pub fn vtime(&self, k: &K) -> f64 {
        self.vtime.get(k).copied().unwrap_or(0.0)
    }

    /// `k` has work again after having none: it starts no earlier than the least virtual time
    /// among `backlogged` (tenants with work now), or, when nobody has work, the clock.
    pub fn arrive<'a>(&mut self, k: &K, backlogged: impl Iterator<Item = &'a K>)
    where
        K: 'a,
    {
        let floor = backlogged
            .filter(|b| *b != k)
            .map(|b| self.vtime(b))
            .min_by(f64::total_cmp)
            .unwrap_or(self.clock);
        let v = self.vtime(k).max(floor);
        self.vtime.insert(k.clone(), v);
    }

    /// Charges `seconds` of device time to `k`, scaled by its weight.
    pub fn charge(&mut self, k: &K, seconds: f64, weight: u32) {
        *self.vtime.entry(k.clone()).or_default() += seconds / f64::from(weight.max(1));
    }

    /// Forgets the `idle` tenants that would restart at the floor anyway: those no later than
    /// the least virtual time among `backlogged`, or, while nobody is, the last such floor
    /// (the clock, which only moves forward). One that used more than the floor keeps its
    /// virtual time however long it stays away: forgotten, a tenant that had overrun its
    /// share came back level with the others after a pause. At most one entry per tenant.
    pub fn forget<'a>(&mut self, idle: impl Fn(&K) -> bool, backlogged: impl Iterator<Item = &'a K>)
    where
        K: 'a,
    {
        if let Some(floor) = backlogged.map(|b| self.vtime(b)).min_by(f64::total_cmp) {
            self.clock = self.clock.max(floor);
        }
        let floor = self.clock;
        self.vtime.retain(|k, v| !idle(k) || *v > floor);
    }

    /// The candidate that leads next: least virtual time; among equals, the one with the least
    /// work waiting (a tenant that just arrived beside a busy one goes first), then the first
    /// given. Candidates come with their waiting samples. (The dispatcher walks [`Fair::order`].)
    #[cfg(test)]
    pub fn leader<'a>(&self, candidates: impl Iterator<Item = (&'a K, i64)>) -> Option<&'a K>
    where
        K: 'a,
    {
        self.order(candidates).into_iter().next()
    }

    /// The candidates in the order they lead: [`Fair::leader`]'s, then the next, and so on.
    pub fn order<'a>(&self, candidates: impl Iterator<Item = (&'a K, i64)>) -> Vec<&'a K>
    where
        K: 'a,
    {
        let mut order: Vec<(&K, f64, i64)> = candidates
            .map(|(c, work)| (c, self.vtime(c), work))
            .collect();
        // Stable: among equals, the first given.
        order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)));
        order.into_iter().map(|(k, _, _)| k).collect()
    }
}

/// Work one tenant has for the segment a batch runs: its weight, its virtual time and its
/// calls' remaining samples, oldest first.
#[derive(Debug, Clone)]
pub struct Pending {
    pub weight: u32,
    pub vtime: f64,
    pub calls: Vec<i64>,
}

/// The slice of a call a batch takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub tenant: usize,
    pub call: usize,
    pub take: i64,
}

/// How much longer than its own samples alone a pooled batch may hold a tenant, with `n`
/// tenants active: fair sharing would give each a call's samples in about `n` times their own
/// device time; one of those shares goes to waiting for a worker and to the batches other
/// workers run meanwhile (the memory model's times are for the device alone), and a batch may
/// take this fraction of the rest. With two tenants, nobody joins a leader's batch.
pub const FAIR_SHARE: f64 = 0.75;

/// How much longer than its own samples alone a pooled batch may hold a tenant when `active`
/// tenants share the device: never shorter than its own samples.
pub fn stretch(active: usize) -> f64 {
    (FAIR_SHARE * active.saturating_sub(1) as f64).max(1.0)
}

/// Fills one batch of at most `cap` samples led by `pending[0]` (the tenant with the least
/// virtual time): the leader takes as much of its oldest calls as fits; every other tenant with
/// work for the same segment may then add samples, but only as many as keep its virtual time,
/// at `per_sample` estimated device seconds a sample, no later than the leader's after this
/// batch plus `ahead` seconds, and only while the batch stays within `joined_cap(leader's
/// samples)` samples (the dispatcher allows [`stretch`] times the leader's samples' time) and,
/// for a tenant whose work would all be in it, within `joined_cap(its own samples)`: a light
/// tenant does not join a heavy one's long batch. Pooling thus never lets a tenant get ahead of
/// its weight's share by more than `ahead` (one that used more joins nobody's batch until the
/// others have caught up) nor makes a leader wait long for its batch mates.
pub fn fill(
    pending: &[Pending],
    cap: i64,
    per_sample: f64,
    ahead: f64,
    joined_cap: impl Fn(i64) -> i64,
) -> Vec<Slice> {
    let mut out = Vec::new();
    let Some(leader) = pending.first() else {
        return out;
    };
    let mut room = cap.max(0);
    let mut take_from = |t: usize, calls: &[i64], mut quota: i64, room: &mut i64| -> i64 {
        let mut took = 0;
        for (c, &left) in calls.iter().enumerate() {
            let take = left.min(quota).min(*room);
            if take <= 0 {
                break;
            }
            out.push(Slice {
                tenant: t,
                call: c,
                take,
            });
            quota -= take;
            *room -= take;
            took += take;
        }
        took
    };
    let led = take_from(0, &leader.calls, i64::MAX, &mut room);
    room = room.min((joined_cap(led) - led).max(0));
    let lw = f64::from(leader.weight.max(1));
    // Without an estimate of a sample's time, every tenant counts as level with the leader.
    let known = per_sample.is_finite() && per_sample > 0.0;
    let per_sample = if known { per_sample } else { 1.0 };
    let level = |p: &Pending| if known { p.vtime } else { leader.vtime };
    let after = leader.vtime + led as f64 * per_sample / lw + ahead.max(0.0);
    let mut used = led;
    for (t, p) in pending.iter().enumerate().skip(1) {
        if room == 0 {
            break;
        }
        let allowed = ((after - level(p)) * f64::from(p.weight.max(1)) / per_sample).floor();
        if allowed < 1.0 {
            continue;
        }
        let quota = allowed.min(i64::MAX as f64) as i64;
        // A joiner whose work would all be in the batch is held by it as the leader is: it
        // joins only if the batch stays within `joined_cap` of its own samples.
        let all: i64 = p.calls.iter().sum();
        let want = all.min(quota).min(room);
        if want == all && used + want > joined_cap(want) {
            continue;
        }
        used += take_from(t, &p.calls, quota, &mut room);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(weight: u32, vtime: f64, calls: &[i64]) -> Pending {
        Pending {
            weight,
            vtime,
            calls: calls.to_vec(),
        }
    }

    fn took(s: &[Slice], t: usize) -> i64 {
        s.iter().filter(|s| s.tenant == t).map(|s| s.take).sum()
    }

    #[test]
    fn pooled_batches_hold_a_tenant_longer_the_more_tenants_share_the_device() {
        assert_eq!(stretch(1), 1.0);
        assert_eq!(stretch(2), 1.0);
        assert_eq!(stretch(5), 3.0);
        assert_eq!(stretch(9), 6.0);
    }

    #[test]
    fn a_light_tenant_does_not_join_a_heavy_leaders_long_batch() {
        // The batch may hold a member at most 1.5x its own samples' count (time linear here).
        let cap = |own: i64| own + own / 2;
        // A heavy leader with 16 samples: a light tenant's 4 would wait for 20; it stays out.
        let s = fill(&[p(1, 0.0, &[16]), p(1, 0.0, &[4])], 32, 0.01, 0.0, cap);
        assert_eq!((took(&s, 0), took(&s, 1)), (16, 0));
        // A heavy tenant still adds what the leader's cap leaves: the rest of its work waits
        // anyway.
        let s = fill(&[p(1, 0.0, &[4]), p(1, 0.0, &[192])], 32, 0.01, 0.0, cap);
        assert_eq!((took(&s, 0), took(&s, 1)), (4, 2));
        // Similar tenants, a generous cap (many active tenants): all join.
        let similar = [p(1, 0.0, &[4]), p(1, 0.0, &[5]), p(1, 0.03, &[4])];
        let s = fill(&similar, 32, 0.01, 0.0, |own| own * 6);
        // (The 5-sample tenant adds 4: no more than the leader's virtual time allows; the one
        // 0.03 s ahead adds 1.)
        assert_eq!((took(&s, 0), took(&s, 1), took(&s, 2)), (4, 4, 1));
        // Allowed to be up to 0.05 s ahead of the leader, both join with all their work.
        let s = fill(&similar, 32, 0.01, 0.05, |own| own * 6);
        assert_eq!((took(&s, 0), took(&s, 1), took(&s, 2)), (4, 5, 4));
    }

    #[test]
    fn the_leader_fills_what_it_can_and_others_join_only_up_to_its_virtual_time() {
        // Level tenants: a light leader with 4 samples; a heavy one adds as many.
        let s = fill(&[p(1, 0.0, &[4]), p(1, 0.0, &[192])], 32, 0.01, 0.0, |_| 32);
        assert_eq!((took(&s, 0), took(&s, 1)), (4, 4));
        // Weight 2: twice as many.
        let s = fill(&[p(1, 0.0, &[4]), p(2, 0.0, &[192])], 32, 0.01, 0.0, |_| 32);
        assert_eq!(took(&s, 1), 8);
        // A tenant 0.3 s ahead joins nobody's 4-sample (0.04 s) batch.
        let s = fill(&[p(1, 0.0, &[4]), p(1, 0.3, &[192])], 32, 0.01, 0.0, |_| 32);
        assert_eq!((took(&s, 0), took(&s, 1)), (4, 0));
        // ... and one 0.02 s ahead adds 2.
        let s = fill(
            &[p(1, 0.0, &[4]), p(1, 0.02, &[192])],
            32,
            0.01,
            0.0,
            |_| 32,
        );
        assert_eq!(took(&s, 1), 2);
        // A heavy leader takes the whole cap from its oldest calls.
        let s = fill(
            &[p(1, 0.0, &[10, 192]), p(1, 0.0, &[4])],
            16,
            0.01,
            0.0,
            |_| 16,
        );
        assert_eq!((took(&s, 0), took(&s, 1)), (16, 0));
        assert_eq!(
            s[0],
            Slice {
                tenant: 0,
                call: 0,
                take: 10
            }
        );
        assert_eq!(
            s[1],
            Slice {
                tenant: 0,
                call: 1,
                take: 6
            }
        );
        // Alone, a tenant fills the batch (work-conserving).
        let s = fill(&[p(1, 0.0, &[8, 8, 8, 8])], 20, 0.01, 0.0, |_| 20);
        assert_eq!(took(&s, 0), 20);
        assert!(fill(&[], 8, 0.01, 0.0, |_| 8).is_empty());
        assert!(fill(&[p(1, 0.0, &[3])], 0, 0.01, 0.0, |_| 0).is_empty());
        // Joiners stop where the batch would run too long for the leader.
        let s = fill(
            &[p(1, 0.0, &[4]), p(1, 0.0, &[192])],
            32,
            0.01,
            0.0,
            |led| led * 3 / 2,
        );
        assert_eq!((took(&s, 0), took(&s, 1)), (4, 2));
    }

    /// Simulates the device: two tenants always have work, one in calls of 192 samples, one in
    /// calls of 4; batches are capped (a time slice); the leader is the one with the least
    /// virtual time. Over many batches each tenant's share of device time follows its weight.
    fn shares(weights: (u32, u32)) -> (f64, f64) {
        let mut fair: Fair<usize> = Fair::default();
        let mut left = [192i64, 4i64];
        let size_of = [192i64, 4i64];
        let w = [weights.0, weights.1];
        let mut used = [0.0f64; 2];
        let per_sample = 0.001;
        for _ in 0..20_000 {
            let leader = *fair
                .leader([(&0usize, left[0]), (&1, left[1])].into_iter())
                .expect("work");
            let other = 1 - leader;
            let pending = [
                p(w[leader], fair.vtime(&leader), &[left[leader]]),
                p(w[other], fair.vtime(&other), &[left[other]]),
            ];
            let s = fill(&pending, 32, per_sample, 0.0, |_| 32);
            for sl in &s {
                let t = if sl.tenant == 0 { leader } else { other };
                let part = per_sample * sl.take as f64;
                used[t] += part;
                fair.charge(&t, part, w[t]);
                left[t] -= sl.take;
                if left[t] == 0 {
                    left[t] = size_of[t];
                }
            }
        }
        let all = used[0] + used[1];
        (used[0] / all, used[1] / all)
    }

    #[test]
    fn device_time_follows_weights_whatever_the_call_sizes() {
        for (weights, heavy) in [((1, 1), 0.5), ((2, 1), 2.0 / 3.0), ((1, 3), 0.25)] {
            let (h, l) = shares(weights);
            assert!(
                (h - heavy).abs() < 0.02,
                "{weights:?}: heavy {h}, light {l}"
            );
        }
    }

    #[test]
    fn a_tenant_back_from_idle_starts_at_the_floor() {
        let mut fair: Fair<&str> = Fair::default();
        fair.charge(&"a", 10.0, 1);
        fair.charge(&"b", 12.0, 1);
        // `c` was idle: it does not get 10 s of credit over `a`.
        fair.arrive(&"c", ["a", "b"].iter());
        assert_eq!(fair.vtime(&"c"), 10.0);
        let work = [("b", 1), ("c", 1), ("a", 1)];
        assert_eq!(fair.leader(work.iter().map(|(k, w)| (k, *w))), Some(&"c"));
        fair.charge(&"c", 0.5, 1);
        assert_eq!(fair.leader(work.iter().map(|(k, w)| (k, *w))), Some(&"a"));
        // Level tenants: the one with less work waiting leads.
        let mut level: Fair<&str> = Fair::default();
        level.charge(&"heavy", 1.0, 1);
        level.arrive(&"light", ["heavy"].iter());
        let work = [("heavy", 150), ("light", 2)];
        assert_eq!(
            level.leader(work.iter().map(|(k, w)| (k, *w))),
            Some(&"light")
        );
        // A tenant that used more than the floor keeps its own virtual time.
        fair.arrive(&"b", ["a"].iter());
        assert_eq!(fair.vtime(&"b"), 12.0);
    }

    #[test]
    fn a_tenant_ahead_of_the_floor_keeps_its_time_while_idle() {
        let mut fair: Fair<&str> = Fair::default();
        fair.charge(&"light", 1.0, 1);
        fair.charge(&"heavy", 5.0, 1);
        fair.charge(&"gone", 0.5, 1);
        // `heavy` and `gone` pause while `light` has work: `gone` was behind and is forgotten
        // (it restarts at the floor anyway), `heavy` keeps its 5 s.
        fair.forget(|t| *t != "light", ["light"].iter());
        assert_eq!(fair.vtime(&"gone"), 0.0);
        fair.arrive(&"heavy", ["light"].iter());
        assert_eq!(fair.vtime(&"heavy"), 5.0);
        let work = [("heavy", 1), ("light", 1)];
        assert_eq!(
            fair.leader(work.iter().map(|(k, w)| (k, *w))),
            Some(&"light")
        );
        // Everyone idle (the device quiet): nobody is forgiven; `light`, at the floor, is
        // forgotten, and comes back at the floor, not at 0.
        fair.forget(|_| true, std::iter::empty());
        assert_eq!(fair.vtime(&"heavy"), 5.0);
        fair.arrive(&"light", std::iter::empty());
        assert_eq!(fair.vtime(&"light"), 1.0);
        fair.arrive(&"heavy", ["light"].iter());
        assert_eq!(fair.vtime(&"heavy"), 5.0);
    }

    #[test]
    fn a_tenant_back_at_a_quiet_device_starts_at_the_last_floor_not_at_zero() {
        // `a` works alone for an hour; `l`, idle, is forgotten. The device goes quiet; `l`
        // comes first: it starts level with `a`, not an hour ahead of it.
        let mut fair: Fair<&str> = Fair::default();
        fair.charge(&"l", 1.0, 1);
        fair.charge(&"a", 3600.0, 1);
        fair.forget(|t| *t == "l", ["a"].iter());
        assert_eq!(fair.vtime(&"l"), 0.0);
        fair.forget(|_| true, std::iter::empty());
        fair.arrive(&"l", std::iter::empty());
        fair.arrive(&"a", ["l"].iter());
        assert_eq!((fair.vtime(&"l"), fair.vtime(&"a")), (3600.0, 3600.0));
    }
}
