//! Open connections, in all and per client address, and which of them may be closed to make
//! room for a new one.
//!
//! When every connection is taken, a new one closes one that carries no request of a tenant (or
//! of the operator): one whose client has sent no token yet (a half-sent head, a request still
//! being read or refused), or that waits for its next request. Clients from many addresses (an
//! IPv6 prefix holds billions), each within `max_connections_per_client`, could otherwise hold
//! every connection with half-sent heads renewed every `header_timeout`, and keep every tenant
//! out. Those that never carried an authenticated request go first, oldest first, and with them
//! (by when they became idle) a tenant's idle connections past its [`busy_cap`]; then those
//! that did, the longest idle first. A connection is busy from its request's authentication to
//! the last byte of its response leaving hyper (its chunks are dropped once written), and is
//! never closed for another meanwhile. A newcomer is refused when no connection may be closed.
//! A client at its cap of connections (`max_connections_per_client`) closes one of its own in
//! the same order, and is refused when none of its own may be closed.
//!
//! A tenant holds at most [`busy_cap`] connections busy (its invocations running and waiting,
//! and a few more for its other requests); a request of its past that is answered 429 at once
//! (`http/extract.rs`), and its connection stays closable. Pipelined requests whose answers the
//! client does not read (a list's, which takes no slot) had held any number of connections
//! busy from many addresses, and every other tenant out.

use crate::locks::lock;
use axum::body::{Body, Bytes};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Open connections and their states.
#[derive(Debug, Default)]
pub struct Connections {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    open: usize,
    /// Each client address's connections (so that a newcomer at its address's cap finds what
    /// it may close in its own, not by walking every open connection under this lock).
    per_client: HashMap<IpAddr, Client>,
    /// Connections that may be closed for a newcomer, in the order they are: by (whether it
    /// is kept: it carried an authenticated request, of the operator or of a tenant within its
    /// [`busy_cap`] of kept idle connections; when it became idle).
    idle: BTreeMap<(bool, u64), u64>,
    /// Each tenant's kept idle connections.
    kept: HashMap<Arc<str>, usize>,
    conns: HashMap<u64, Conn>,
    /// Connections each tenant holds busy.
    tenants: HashMap<Arc<str>, usize>,
    /// Open connections chosen to be closed for a newcomer (not yet gone).
    closing: usize,
    /// The cap on open connections, as the latest newcomer was given it.
    max: usize,
    /// The cap on a client's, likewise.
    per_client_max: usize,
    next: u64,
}

/// A client address's open connections.
#[derive(Debug, Default)]
struct Client {
    open: usize,
    /// Those of them chosen to be closed (not yet gone).
    closing: usize,
    /// Those of them that may be closed for a newcomer, keyed as in [`State::idle`].
    idle: BTreeMap<(bool, u64), u64>,
}

#[derive(Debug)]
struct Conn {
    /// Its client's address.
    ip: IpAddr,
    /// Its key in `idle`, while it is there.
    idle: Option<(bool, u64)>,
    /// Authenticated requests in flight (each until its response's last chunk is dropped).
    busy: usize,
    /// The tenant whose requests hold it busy (counted in `State::tenants`); none for the
    /// operator's.
    holder: Option<Arc<str>>,
    served: bool,
    /// The tenant whose request it carried last, with its [`busy_cap`]; none for the
    /// operator's, or before any.
    last: Option<(Arc<str>, usize)>,
    /// Chosen to be closed for a newcomer; a request authenticated before the connection's task
    /// saw it takes that back.
    closing: bool,
    /// A close taken back: the newcomer was let in all the same, so the connection closes
    /// when its requests are done, rather than waiting for its next one (the count stays one
    /// over `max` only while they run).
    owed: bool,
    close: Arc<tokio::sync::Notify>,
}

impl State {
    /// Connection `id`'s holder no longer holds it busy.
    fn unhold(&mut self, id: u64) {
        let Some(t) = self.conns.get_mut(&id).and_then(|c| c.holder.take()) else {
            return;
        };
        if let Some(n) = self.tenants.get_mut(&t) {
            *n -= 1;
            if *n == 0 {
                self.tenants.remove(&t);
            }
        }
    }

    /// Whether client `ip` has `cap` connections that stay (open, less those closing).
    fn at_cap(&self, ip: IpAddr, cap: usize) -> bool {
        self.per_client
            .get(&ip)
            .is_some_and(|c| c.open - c.closing >= cap)
    }

    /// Connection `id` (of client `ip`) is chosen to be closed, or no longer is (`by` 1 or
    /// -1), in the host's count and its client's.
    fn count_closing(&mut self, ip: IpAddr, by: isize) {
        self.closing = self.closing.saturating_add_signed(by);
        if let Some(c) = self.per_client.get_mut(&ip) {
            c.closing = c.closing.saturating_add_signed(by);
        }
    }

    /// Takes connection `id` out of `idle`, if it is there.
    fn unidle(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(key) = c.idle.take() else {
            return;
        };
        self.idle.remove(&key);
        if let Some(client) = self.per_client.get_mut(&c.ip) {
            client.idle.remove(&key);
        }
        if let (true, Some((t, _))) = (key.0, &c.last)
            && let Some(n) = self.kept.get_mut(t)
        {
            *n -= 1;
            if *n == 0 {
                self.kept.remove(t);
            }
        }
    }

    /// Closes connection `id` for a newcomer.
    fn close(&mut self, id: u64) {
        self.unidle(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.closing = true;
            c.close.notify_one();
            let ip = c.ip;
            self.count_closing(ip, 1);
        }
    }

    fn make_idle(&mut self, id: u64) {
        let seq = self.next;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.busy > 0 || c.closing || c.idle.is_some() {
            return;
        }
        if c.owed {
            c.owed = false;
            c.closing = true;
            c.close.notify_one();
            let ip = c.ip;
            self.count_closing(ip, 1);
            return;
        }
        // A tenant's idle connections past its cap rank with those that never carried a
        // request: a tenant holding every connection idle after one request each, and opening
        // bare connections in a loop, closed every other tenant's new connection before it
        // could authenticate.
        let kept = c.served
            && match &c.last {
                None => true,
                Some((t, cap)) => {
                    let n = self.kept.entry(Arc::clone(t)).or_default();
                    let within = *n < *cap;
                    *n += usize::from(within);
                    if *n == 0 {
                        self.kept.remove(t);
                    }
                    within
                }
            };
        let key = (kept, seq);
        c.idle = Some(key);
        let ip = c.ip;
        self.idle.insert(key, id);
        self.per_client.entry(ip).or_default().idle.insert(key, id);
        self.next += 1;
    }
}

/// A connection counted while it is open.
#[derive(Debug)]
pub struct Counted {
    track: Track,
    ip: IpAddr,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut s = lock(&self.track.conns.state);
        s.open -= 1;
        s.unhold(self.track.id);
        s.unidle(self.track.id);
        if s.conns.remove(&self.track.id).is_some_and(|c| c.closing) {
            s.count_closing(self.ip, -1);
        }
        if let Some(c) = s.per_client.get_mut(&self.ip) {
            c.open -= 1;
            if c.open == 0 {
                s.per_client.remove(&self.ip);
            }
        }
    }
}

impl Counted {
    /// Resolves when the connection is to be closed for a newcomer.
    pub async fn closed(&self) {
        let close = {
            let s = lock(&self.track.conns.state);
            match s.conns.get(&self.track.id) {
                Some(c) => Arc::clone(&c.close),
                None => return,
            }
        };
        loop {
            close.notified().await;
            let s = lock(&self.track.conns.state);
            if s.conns.get(&self.track.id).is_none_or(|c| c.closing) {
                return;
            }
        }
    }

    /// What the connection's requests carry (see [`Track`]).
    pub fn track(&self) -> Track {
        self.track.clone()
    }
}

impl Connections {
    /// Counts a new connection from `ip`: when its client has `per_client` open, it closes one
    /// of them, and when all `max` are open, one of anyone's, that carries no authenticated
    /// request (see the module's doc), and is refused (closing none) if it cannot. (Until that
    /// one's task ends, a moment later, or the requests end of one that authenticated a
    /// request meanwhile, one more than `max` is counted. A close taken back stays counted until its connection's requests end: the next
    /// newcomer then closes one more, and is refused if there are not enough to close.)
    pub fn enter(self: &Arc<Self>, ip: IpAddr, max: usize, per_client: usize) -> Option<Counted> {
        let mut s = lock(&self.state);
        s.max = max;
        s.per_client_max = per_client;
        // A client at its cap closes one of its own that may be closed for a newcomer, in the
        // order the host's cap does (one that never carried a tenant's request first, then the
        // longest idle), and is refused if none may. It was refused at its cap: a process with
        // no token, behind an address tenants share (a NAT, a compute node), kept every one of
        // their new connections out by polling `/healthz` on its cap of connections.
        let own = if s.at_cap(ip, per_client) {
            let own = s
                .per_client
                .get(&ip)
                .and_then(|c| c.idle.values().next())
                .copied();
            Some(own?)
        } else {
            None
        };
        // Those that stay: open, less those closing (and the client's own, if it closes one).
        // A close taken back (owed) stays until its requests end, so a newcomer meanwhile
        // closes one more: the count does not grow past `max` by one for each close taken
        // back. Nothing is closed unless the newcomer gets in.
        let mine = usize::from(own.is_some());
        let need = (s.open - s.closing - mine + 1).saturating_sub(max);
        if s.idle.len() - mine < need {
            return None;
        }
        if let Some(victim) = own {
            s.close(victim);
        }
        for _ in 0..need {
            let Some(&victim) = s.idle.values().next() else {
                break;
            };
            s.close(victim);
        }
        s.open += 1;
        s.per_client.entry(ip).or_default().open += 1;
        let id = s.next;
        s.next += 1;
        s.conns.insert(
            id,
            Conn {
                ip,
                idle: None,
                busy: 0,
                holder: None,
                served: false,
                last: None,
                closing: false,
                owed: false,
                close: Arc::new(tokio::sync::Notify::new()),
            },
        );
        s.make_idle(id);
        Some(Counted {
            track: Track {
                conns: Arc::clone(self),
                id,
            },
            ip,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.state).open
    }
}

/// A connection, as its requests carry it (a request extension): authenticating a request
/// makes the connection busy until its response is sent ([`Track::busy`]).
#[derive(Debug, Clone)]
pub struct Track {
    conns: Arc<Connections>,
    id: u64,
}

impl Track {
    /// A request of this connection was authenticated (a tenant's, with its [`busy_cap`]; or
    /// the operator's): it is not closed for a newcomer until the returned guard, and every
    /// chunk of the response it is put into, are dropped. Not when the tenant holds its cap of
    /// other connections busy, or the connection is being closed and may not be taken back
    /// (see below): the connection stays as it was.
    pub fn busy(&self, tenant: Option<(&str, usize)>) -> Result<Arc<Busy>, NotBusy> {
        let mut s = lock(&self.conns.state);
        let s = &mut *s;
        // Authenticated before its task saw its close: it may take the close back only while
        // those staying are within `max`, and its client's within its cap (a newcomer closes
        // one more then). Past that, the request goes with its connection (clients retry), so
        // that closes taken back at that instant, again and again, cannot grow the count.
        if let Some(c) = s.conns.get(&self.id) {
            if c.closing && (s.open - s.closing > s.max || s.at_cap(c.ip, s.per_client_max)) {
                return Err(NotBusy::Closing);
            }
            if c.busy == 0
                && let Some((t, cap)) = tenant
            {
                let held = s.tenants.get(t).copied().unwrap_or(0);
                if held >= cap {
                    return Err(NotBusy::OverCap(held));
                }
            }
        }
        s.unidle(self.id);
        if let Some(c) = s.conns.get_mut(&self.id) {
            let last = tenant.map(|(t, cap)| (Arc::<str>::from(t), cap));
            if c.busy == 0
                && let Some((t, _)) = &last
            {
                *s.tenants.entry(Arc::clone(t)).or_default() += 1;
                c.holder = Some(Arc::clone(t));
            }
            c.busy += 1;
            c.served = true;
            c.last = last;
            // Authenticated before its task saw the close: the request goes on, and the
            // connection closes after it.
            if c.closing {
                c.closing = false;
                c.owed = true;
                let ip = c.ip;
                s.count_closing(ip, -1);
            }
        }
        Ok(Arc::new(Busy(self.clone())))
    }
}

/// Why an authenticated request did not make its connection busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotBusy {
    /// Its tenant holds this many connections busy, its [`busy_cap`].
    OverCap(usize),
    /// The connection is being closed for a newcomer (the request goes with it).
    Closing,
}

/// Connections a tenant may hold busy at once: one for each invocation it may run or queue, and
/// [`BUSY_BESIDE_INVOCATIONS`] for its other requests (lists, uploads, profiles, placement).
pub fn busy_cap(concurrency: usize, queue: usize) -> usize {
    concurrency
        .saturating_add(queue)
        .saturating_add(BUSY_BESIDE_INVOCATIONS)
}

/// See [`busy_cap`].
pub const BUSY_BESIDE_INVOCATIONS: usize = 4;

/// What `hapi-host check` says of a policy's connections: each tenant whose [`busy_cap`] is
/// at least `max_connections` (it may hold every connection busy, so its cap bounds nothing),
/// and, as a note, caps that add up past `max_connections` (overcommitted: with every tenant at
/// its cap at once, a newcomer is refused, as it is once the host is full).
pub fn cap_warnings<'a>(
    max_connections: usize,
    tenants: impl IntoIterator<Item = (&'a str, usize, usize)>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut sum = 0usize;
    for (name, concurrency, queue) in tenants {
        let cap = busy_cap(concurrency, queue);
        sum = sum.saturating_add(cap);
        if cap >= max_connections {
            out.push(format!(
                "warning: tenant `{name}` may hold all {max_connections} connections busy (its \
                 cap, concurrency + queue + {BUSY_BESIDE_INVOCATIONS}, is {cap}): lower its \
                 concurrency or queue, or raise host.http.max_connections"
            ));
        }
    }
    if sum > max_connections {
        out.push(format!(
            "note: the tenants' caps of busy connections add up to {sum}, past \
             host.http.max_connections ({max_connections}): with every tenant at its cap at \
             once, a newcomer is refused"
        ));
    }
    out
}

/// A connection's authenticated request in flight; dropped with its response's last chunk.
#[derive(Debug)]
pub struct Busy(Track);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = lock(&self.0.conns.state);
        if let Some(c) = s.conns.get_mut(&self.0.id) {
            c.busy = c.busy.saturating_sub(1);
            if c.busy == 0 {
                s.unhold(self.0.id);
            }
        }
        s.make_idle(self.0.id);
    }
}

/// What a request carries of its connection (an extension the server adds to each request):
/// [`Carried::authenticated`] makes the connection busy until the response
/// ([`Carried::respond`]) is sent.
#[derive(Debug, Clone)]
pub struct Carried {
    track: Track,
    busy: Arc<Mutex<Option<Arc<Busy>>>>,
}

impl Carried {
    pub fn new(track: Track) -> Self {
        Self {
            track,
            busy: Arc::default(),
        }
    }

    /// The request's token is a tenant's (with its [`busy_cap`]) or the operator's: its
    /// connection is busy, or why not.
    pub fn authenticated(&self, tenant: Option<(&str, usize)>) -> Result<(), NotBusy> {
        let mut busy = lock(&self.busy);
        if busy.is_none() {
            *busy = Some(self.track.busy(tenant)?);
        }
        Ok(())
    }

    /// The connection's busy guard, if the request was authenticated (and it was not taken).
    fn take(&self) -> Option<Arc<Busy>> {
        lock(&self.busy).take()
    }

    /// The request was refused and its body is being drained: the connection may be closed
    /// for a newcomer meanwhile (a tenant's withheld bodies would otherwise hold connections
    /// for `body_timeout` each, outside its admission).
    pub fn release(&self) {
        drop(self.take());
    }

    /// The response, holding the connection busy until its last chunk is written, if the
    /// request was authenticated.
    pub fn respond(&self, resp: axum::response::Response) -> axum::response::Response {
        match self.take() {
            Some(busy) => resp.map(|body| holding(body, busy)),
            None => resp,
        }
    }
}

/// `body` with `busy` held by the body and by each of its chunks, so that it is dropped when
/// the response's last byte has been written to the socket (hyper drops each chunk once
/// written, and ends the body earlier, with up to its write buffer still to write).
pub fn holding(body: Body, busy: Arc<Busy>) -> Body {
    use http_body_util::BodyExt;
    Body::new(
        body.map_frame(move |frame| frame.map_data(|bytes| Held::bytes(bytes, Arc::clone(&busy)))),
    )
}

/// Bytes that hold `guard` for as long as they are held: hyper drops each chunk of a response
/// once its last byte is written (or the connection is gone). A response's chunks hold the
/// connection busy here, and an invocation's output holds its tenant's slot (`invoke.rs`).
pub(crate) struct Held<B, G> {
    bytes: B,
    _guard: G,
}

impl<B: AsRef<[u8]> + Send + 'static, G: Send + 'static> Held<B, G> {
    pub(crate) fn bytes(bytes: B, guard: G) -> Bytes {
        Bytes::from_owner(Self {
            bytes,
            _guard: guard,
        })
    }
}

impl<B: AsRef<[u8]>, G> AsRef<[u8]> for Held<B, G> {
    fn as_ref(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::Context;

    /// Each client's counts and closable connections are those of its connections.
    fn check(c: &Connections) {
        let s = lock(&c.state);
        let mut ips: Vec<IpAddr> = s.conns.values().map(|c| c.ip).collect();
        ips.sort_unstable();
        ips.dedup();
        assert_eq!(
            s.per_client
                .keys()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            ips.iter().copied().collect(),
            "the clients are those with connections"
        );
        for ip in ips {
            let client = &s.per_client[&ip];
            let mine = || s.conns.values().filter(move |c| c.ip == ip);
            assert_eq!(client.open, mine().count(), "{ip}: open");
            assert_eq!(client.closing, mine().filter(|c| c.closing).count(), "{ip}");
            let idle: BTreeMap<(bool, u64), u64> = s
                .idle
                .iter()
                .filter(|(_, id)| s.conns[*id].ip == ip)
                .map(|(k, id)| (*k, *id))
                .collect();
            assert_eq!(client.idle, idle, "{ip}: closable");
        }
        let closing = s.conns.values().filter(|c| c.closing).count();
        assert_eq!(s.closing, closing, "closing in all");
        assert_eq!(s.open, s.conns.len(), "open in all");
    }

    /// Connections entering, carrying requests (authenticated, some taking a close back),
    /// finishing and going, from three addresses at small caps, in a fixed pseudo-random
    /// order: each client's counts stay those of its connections throughout.
    #[test]
    fn each_clients_counts_follow_its_connections() {
        let c = Arc::new(Connections::default());
        let ips: [IpAddr; 3] = [
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
            [10, 0, 0, 3].into(),
        ];
        let mut open: Vec<Counted> = Vec::new();
        let mut busy: Vec<Arc<Busy>> = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            usize::try_from(x % n as u64).expect("small")
        };
        let mut closed = 0;
        for _ in 0..5_000 {
            match next(6) {
                0 | 1 => {
                    if let Some(k) = c.enter(ips[next(3)], 6, 3) {
                        open.push(k);
                    }
                }
                2 if !open.is_empty() => {
                    let i = next(open.len());
                    let tenant = ["t1", "t2"][next(2)];
                    if let Ok(b) = open[i].track().busy(Some((tenant, 2))) {
                        busy.push(b);
                    }
                }
                3 if !busy.is_empty() => {
                    let i = next(busy.len());
                    busy.swap_remove(i);
                }
                4 if !open.is_empty() => {
                    // A connection's task ends: one told to close first (each told once:
                    // the first look takes the notice).
                    let i = match open.iter().position(|k| ready(k.closed())) {
                        Some(i) => {
                            closed += 1;
                            i
                        }
                        None => next(open.len()),
                    };
                    open.swap_remove(i);
                }
                _ => {}
            }
            check(&c);
        }
        assert!(
            closed > 100,
            "only {closed} closed for newcomers: the test proves little"
        );
        drop(busy);
        drop(open);
        check(&c);
        assert!(lock(&c.state).per_client.is_empty());
    }

    /// Connection `c` carries an operator's request (no tenant's cap).
    fn busy(c: &Counted) -> Arc<Busy> {
        c.track().busy(None).expect("no cap")
    }

    /// Polls `f` once: whether it is ready.
    fn ready(f: impl Future<Output = ()>) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn a_newcomer_closes_one_that_carries_no_authenticated_request() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let a1 = c.enter(a, 3, 2).expect("first");
        let a2 = c.enter(a, 3, 2).expect("second");
        let b1 = c.enter(b, 3, 2).expect("another client");
        // a1 served a tenant and waits for its next request; a2 and b1 never carried one:
        // a2, the older of those, is closed first, then b1, then a1.
        drop(busy(&a1));
        let b2 = c.enter(b, 3, 2).expect("room made");
        assert!(ready(a2.closed()), "a2 not closed");
        assert!(!ready(b1.closed()) && !ready(a1.closed()));
        drop(a2);
        let busy_b2 = busy(&b2);
        let a3 = c.enter(a, 3, 2).expect("room made");
        assert!(ready(b1.closed()), "b1 not closed");
        drop(b1);
        let _busy_a3 = busy(&a3);
        let b3 = c.enter(b, 3, 3).expect("room made");
        assert!(ready(a1.closed()), "a1 not closed");
        drop(a1);
        // Every one busy but b3, which is closed for the next; then all busy: refused.
        let _busy_b3 = busy(&b3);
        assert!(c.enter(b, 3, 3).is_none(), "all busy");
        // A response sent: its connection may be closed again.
        drop(busy_b2);
        let _b4 = c.enter(b, 3, 3).expect("room made again");
        assert!(ready(b2.closed()));
        assert_eq!(c.open(), 4, "one over until b2's task ends");
    }

    /// A client at its cap closes its own oldest connection that may be closed (one that
    /// never carried a tenant's request, then the longest idle), and is refused only once each
    /// of its connections carries a request. It was refused at its cap whatever its connections
    /// did: a process with no token polling `/healthz` on its cap of connections kept out
    /// everyone behind its address.
    #[test]
    fn a_client_at_its_cap_closes_its_own_connection_that_may_be_closed() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let b1 = c.enter(b, 8, 2).expect("another client's");
        let a1 = c.enter(a, 8, 2).expect("first");
        let a2 = c.enter(a, 8, 2).expect("second");
        drop(busy(&a1));
        // a2 never carried a request: it goes first, and nobody else's.
        let a3 = c.enter(a, 8, 2).expect("a third, closing the second");
        assert!(ready(a2.closed()), "a2 not closed");
        assert!(!ready(a1.closed()) && !ready(b1.closed()));
        // Until a2's task ends it is counted, but closing. a3 carries a request: the next
        // closes a1, idle since its own.
        let busy_a3 = busy(&a3);
        let a4 = c.enter(a, 8, 2).expect("a fourth, closing the first");
        assert!(ready(a1.closed()), "a1 not closed");
        drop((a1, a2));
        // Both carrying a request: refused.
        let _busy = (busy_a3, busy(&a4));
        assert!(c.enter(a, 8, 2).is_none(), "per client");
        assert!(!ready(a3.closed()) && !ready(a4.closed()) && !ready(b1.closed()));
        assert_eq!(c.open(), 3);
    }

    /// A request authenticated on a connection its client's newcomer closed does not take the
    /// close back (the client would stay over its cap while it runs), and a newcomer that
    /// would still be refused closes nothing: a client's own was closed first, then the
    /// newcomer refused when the host had too few others to close.
    #[test]
    fn a_client_at_its_cap_takes_no_close_back_and_closes_nothing_in_vain() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let a1 = c.enter(a, 8, 1).expect("first");
        let _a2 = c.enter(a, 8, 1).expect("second, closing the first");
        assert!(ready(a1.closed()));
        assert_eq!(a1.track().busy(None).err(), Some(NotBusy::Closing));
        drop(a1);
        // One over the host's cap of 1: b1 closes a2, whose request takes the close back.
        let c = Arc::new(Connections::default());
        let a2 = c.enter(a, 1, 1).expect("a2");
        let b1 = c.enter(b, 1, 1).expect("b1, closing a2");
        assert!(ready(a2.closed()));
        let _busy = busy(&a2);
        // b's next would close b1 and still find the host over its cap: refused, b1 kept.
        assert!(c.enter(b, 1, 1).is_none(), "let in");
        assert!(!ready(b1.closed()), "closed in vain");
    }

    /// A tenant's idle connections past its cap rank with those that never carried a request:
    /// a tenant that holds every connection idle after a request each closes its own past
    /// its cap, not another's new connection that has yet to send its head. The newcomer was
    /// closed first, and a loop of bare connections kept every other tenant out.
    #[test]
    fn a_tenants_idle_connections_past_its_cap_close_before_a_newcomer() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let held: Vec<Counted> = (0..4).map(|_| c.enter(a, 5, 8).expect("in")).collect();
        for k in &held {
            drop(
                k.track()
                    .busy(Some(("mallory", 2)))
                    .expect("within its cap"),
            );
        }
        let fresh = c.enter(b, 5, 8).expect("a newcomer");
        let _bare = c.enter(a, 5, 8).expect("room made");
        assert!(!ready(fresh.closed()), "the newcomer was closed");
        assert!(
            ready(held[2].closed()),
            "its oldest idle past its cap was not"
        );
        assert!(!ready(held[0].closed()) && !ready(held[1].closed()));
        // Those within its cap keep their place once one past it is gone, and a request on one
        // past its cap makes it kept again when a kept one is busy.
        drop(held);
        let c = Arc::new(Connections::default());
        let m: Vec<Counted> = (0..3).map(|_| c.enter(a, 4, 8).expect("in")).collect();
        for k in &m {
            drop(
                k.track()
                    .busy(Some(("mallory", 2)))
                    .expect("within its cap"),
            );
        }
        let busy0 = m[0].track().busy(Some(("mallory", 2))).expect("busy");
        drop(m[2].track().busy(Some(("mallory", 2))).expect("again"));
        let fresh = c.enter(b, 4, 8).expect("a newcomer");
        let _next = c.enter(b, 4, 8).expect("room made");
        assert!(
            ready(fresh.closed()),
            "m[1] and m[2] are within its cap now"
        );
        drop(busy0);
    }

    #[test]
    fn a_request_authenticated_before_its_close_is_seen_goes_on_and_then_closes() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let a1 = c.enter(a, 1, 2).expect("first");
        let _a2 = c.enter(a, 1, 2).expect("room made");
        let busy = busy(&a1);
        assert!(!ready(a1.closed()), "closed with a request in flight");
        // Its request done, it closes rather than waiting for its next one.
        drop(busy);
        assert!(ready(a1.closed()), "kept after its request");
    }

    #[test]
    fn served_connections_close_longest_idle_first_and_a_dropped_one_is_not_chosen() {
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let a1 = c.enter(a, 2, 4).expect("first");
        let a2 = c.enter(a, 2, 4).expect("second");
        let (busy1, busy2) = (busy(&a1), busy(&a2));
        // a2 idle first, then a1: a2 has waited longer, though a1 is older.
        drop(busy2);
        drop(busy1);
        let a3 = c.enter(a, 2, 4).expect("room made");
        assert!(ready(a2.closed()) && !ready(a1.closed()));
        // A request's Busy outliving its connection does not make the connection idle again.
        let late = busy(&a3);
        drop(a3);
        drop(late);
        drop(a2);
        let _a4 = c.enter(a, 2, 4).expect("room");
        assert!(!ready(a1.closed()), "closed while there was room");
    }

    #[test]
    fn a_response_holds_its_connection_until_its_last_chunk_is_dropped() {
        use axum::body::HttpBody;
        let c = Arc::new(Connections::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let a1 = c.enter(a, 1, 2).expect("first");
        let mut body = Box::pin(holding(Body::from("an answer"), busy(&a1)));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let chunk = match body.as_mut().poll_frame(&mut cx) {
            std::task::Poll::Ready(Some(Ok(frame))) => frame.into_data().expect("data"),
            other => panic!("no chunk: {other:?}"),
        };
        drop(body);
        assert!(
            c.enter(a, 1, 2).is_none(),
            "closed while its last chunk was unwritten"
        );
        drop(chunk);
        let _a2 = c.enter(a, 1, 2).expect("room once the chunk is written");
        assert!(ready(a1.closed()));
    }

    #[test]
    fn check_warns_of_a_cap_that_bounds_nothing() {
        assert!(cap_warnings(64, [("a", 8, 16), ("b", 8, 16)]).is_empty());
        let w = cap_warnings(64, [("a", 8, 16), ("big", 40, 20)]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("warning: tenant `big` may hold all 64"),
            "{w:?}"
        );
        assert!(w[0].contains("is 64"), "{w:?}");
        assert!(w[1].contains("add up to 92"), "{w:?}");
        let w = cap_warnings(64, [("a", 20, 10), ("b", 20, 10)]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("note: "), "{w:?}");
    }

    #[test]
    fn a_tenant_holds_at_most_its_cap_of_connections_busy() {
        let c = Arc::new(Connections::default());
        let (a, b): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let conns: Vec<Counted> = (0..3).map(|_| c.enter(a, 4, 4).expect("room")).collect();
        let t = Some(("pipe", 2));
        let held: Vec<_> = conns.iter().map(|k| k.track().busy(t)).collect();
        assert!(held[0].is_ok() && held[1].is_ok(), "within its cap");
        assert_eq!(
            held[2].as_ref().err(),
            Some(&NotBusy::OverCap(2)),
            "past its cap"
        );
        // A second request on a connection it holds busy (pipelined) counts no further.
        let again = conns[0].track().busy(t);
        assert!(again.is_ok());
        // Another tenant's, and the operator's, are not held to its cap.
        let other = c.enter(b, 4, 4).expect("room");
        let other_busy = other.track().busy(Some(("bob", 2))).expect("bob's own cap");
        // Full: a newcomer closes the connection past the cap, not those it holds.
        let _newcomer = c.enter(b, 4, 4).expect("room made");
        assert!(ready(conns[2].closed()), "the one past its cap stays");
        assert!(!ready(conns[0].closed()) && !ready(conns[1].closed()) && !ready(other.closed()));
        // Its requests done on one connection (every response chunk dropped), it may hold
        // another; a connection gone with its requests frees its place too.
        drop(held);
        let third = conns[2].track().busy(t);
        assert!(third.is_ok(), "conns[1]'s place came free");
        assert!(
            conns[1].track().busy(t).is_err(),
            "conns[0] and conns[2] held"
        );
        let mut conns = conns;
        drop(conns.remove(2));
        let fourth = conns[1].track().busy(t);
        assert!(fourth.is_ok(), "a connection gone gives its place back");
        // The gone connection's request ends later: nothing more is given back.
        drop(third);
        let fifth = c.enter(a, 5, 5).expect("room");
        assert!(
            fifth.track().busy(t).is_err(),
            "two held: conns[0] and conns[1]"
        );
        drop((again, fourth));
        drop(other_busy);
    }

    #[test]
    fn closes_taken_back_do_not_let_the_count_grow_past_max() {
        let c = Arc::new(Connections::default());
        let max = 3;
        let mut open: Vec<Counted> = (0..max)
            .map(|i| {
                c.enter([127, 0, 0, i as u8 + 1].into(), max, 1)
                    .expect("room")
            })
            .collect();
        let mut held = Vec::new();
        for i in 0..10u8 {
            let Some(newcomer) = c.enter([10, 0, 0, i].into(), max, 1) else {
                break;
            };
            // Each close is taken back by a request authenticated at that instant, whose
            // response then stays unread; the others' tasks see their close and end.
            let mut kept = Vec::new();
            for k in open.drain(..) {
                if ready(k.closed()) {
                    match k.track().busy(None) {
                        Ok(b) if held.len() < 10 => {
                            held.push(b);
                            kept.push(k);
                        }
                        _ => drop(k),
                    }
                } else {
                    kept.push(k);
                }
            }
            open = kept;
            open.push(newcomer);
            assert!(c.open() <= max + 1, "round {i}: {} open", c.open());
        }
    }
}
