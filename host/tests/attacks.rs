//! The hostile suite: every class of attack on tenant isolation, each against a real
//! `hapi-host` process, each followed (or accompanied) by a light tenant's calls.
//!
//! For every attack it checks what the host promises an operator: no 5xx caused by a client or
//! a guest; the host's resident set grows by at most twice the attacker's memory limit plus
//! 64 MiB (plus the device budget where the attack loads models, which the budget bounds;
//! rows that hold connections measure it once they are held, before the light tenant's calls,
//! whose own compute is not the attack's); no
//! call outlives its time limit by more than 0.5 s; the light tenant is never starved (its
//! median within 10x its solo median; the goal, 3x, is reported per row, not asserted: one
//! attack's median moves too much on a shared machine); no connection is held past the
//! timeouts. It prints a table of what it saw (run with `--nocapture`).

mod common;

use common::components::{guest_with, module, section};
use common::{guest, hostile, proc_memory, raw, sample_key};
use hapi_host::policy::hash_token;
use hapi_tests::HostProcess;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VICTIM: &str = "victim-token";
const ATTACKER: &str = "attacker-token";
const HEAVY: &str = "heavy-token";
const OPERATOR: &str = "operator-token";
const MIB: u64 = 1 << 20;
const ATTACKER_MEMORY: u64 = 128 * MIB;
const ATTACKER_TIMEOUT: Duration = Duration::from_secs(1);
const HEAVY_MEMORY: u64 = 512 * MIB;
const HEAVY_CONCURRENCY: u64 = 4;
const BUDGET: u64 = 256 * MIB;
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
const BODY_TIMEOUT: Duration = Duration::from_secs(2);
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);
const PER_CLIENT: usize = 64;
/// The light tenant's goal: its median beside any one attacker within this many times its
/// solo median (reported per row).
const FAIR: f64 = 3.0;
/// Past this, the light tenant is starved and the test fails.
const STARVED: f64 = 10.0;
/// Slack on time limits and timeouts the host promises.
const LATE: Duration = Duration::from_millis(500);

fn policy(dir: &Path, store: &Path, budget: u64) -> String {
    format!(
        r#"
[host]
listen = "127.0.0.1:0"
store = "{store}"
models = "{models}"
state = "{state}"
device = "cpu"
memory_budget = "{budget}B"
# Two invocation workers whatever the cores: the rows that load the workers (int8) test alike.
workers = 2
operator_token_sha256 = "{operator}"
header_timeout = "{header}ms"
body_timeout = "{body}ms"
idle_timeout = "{idle}ms"
max_connections = 512
max_connections_per_client = {per_client}

[tenants.victim]
token_sha256 = "{victim}"
grants = [{{ bucket = "datasets", prefix = "fashion-mnist/" }}]
models = ["resnet18", "efficientnet_lite0"]
memory = "256MiB"
timeout = "30s"
deploy = true
[tenants.victim.functions]
feature-extract = "{fe}"

[tenants.attacker]
token_sha256 = "{attacker}"
grants = [{{ bucket = "datasets", prefix = "fashion-mnist/" }}]
models = ["resnet18", "efficientnet_lite0", "alexnet", "vgg11"]
memory = "{attacker_memory}B"
timeout = "{attacker_timeout}ms"
max_output = "64KiB"
concurrency = 1
queue = 8
deploy = true
capabilities = ["clocks", "random"]
[tenants.attacker.functions]
hostile = "{hostile}"
sleeper = "{sleeper}"

[tenants.heavy]
token_sha256 = "{heavy}"
grants = [{{ bucket = "datasets", prefix = "fashion-mnist/" }}]
models = ["resnet18"]
memory = "{heavy_memory}B"
timeout = "120s"
max_output = "512MiB"
concurrency = {heavy_concurrency}
[tenants.heavy.functions]
hostile = "{hostile}"
"#,
        store = store.display(),
        models = hapi_model::models_dir().display(),
        state = dir.join("state").display(),
        operator = hash_token(OPERATOR),
        header = HEADER_TIMEOUT.as_millis(),
        body = BODY_TIMEOUT.as_millis(),
        idle = IDLE_TIMEOUT.as_millis(),
        per_client = PER_CLIENT,
        victim = hash_token(VICTIM),
        attacker = hash_token(ATTACKER),
        heavy = hash_token(HEAVY),
        attacker_memory = ATTACKER_MEMORY,
        attacker_timeout = ATTACKER_TIMEOUT.as_millis(),
        heavy_memory = HEAVY_MEMORY,
        heavy_concurrency = HEAVY_CONCURRENCY,
        fe = guest("feature-extract").display(),
        hostile = guest("hostile").display(),
        sleeper = guest("sleeper").display(),
    )
}

/// The host process's memory, from /proc.
struct Rss(u32);

impl Rss {
    fn now(&self) -> u64 {
        proc_memory(self.0, "VmRSS:")
    }

    fn peak(&self) -> u64 {
        proc_memory(self.0, "VmHWM:")
    }

    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.0), "5");
    }
}

/// What an attack got back.
#[derive(Debug, Clone)]
struct Outcome {
    status: u16,
    code: String,
    took: Duration,
    note: String,
}

impl Outcome {
    fn of(status: u16, code: &str, took: Duration) -> Self {
        Self {
            status,
            code: code.to_string(),
            took,
            note: String::new(),
        }
    }

    fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

struct Row {
    class: u8,
    attack: String,
    outcome: Outcome,
    growth: u64,
    bound: u64,
    limit: Option<Duration>,
    victim_ms: f64,
    ratio: f64,
}

struct Suite {
    host: HostProcess,
    rss: Rss,
    client: reqwest::Client,
    solo_ms: f64,
    rows: std::sync::Mutex<Vec<Row>>,
    /// The peak a row's growth is taken from, when the row marked it ([`Suite::attack_in_place`]).
    mark: std::sync::Mutex<Option<u64>>,
}

fn victim_body() -> Value {
    json!({"bucket": "datasets", "keys": [sample_key(0), sample_key(1)], "model": "resnet18", "split": 4})
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Suite {
    /// The heavy tenant's `hostile` calls with `body`, as many at a time as it may run, each
    /// loop calling again until `for_` has passed; every call must succeed.
    async fn heavy_loops(&self, for_: Duration, body: Value) -> Outcome {
        let started = Instant::now();
        let until = started + for_;
        let loops = (0..HEAVY_CONCURRENCY).map(|_| async {
            let mut n = 0;
            while Instant::now() < until {
                let (o, _) = self.call(HEAVY, "hostile", body.clone()).await;
                assert_eq!(o.status, 200, "{o:?}");
                n += 1;
            }
            n
        });
        let calls: usize = futures::future::join_all(loops).await.into_iter().sum();
        Outcome::of(200, "ok", started.elapsed()).note(format!("{calls} calls"))
    }

    async fn call(&self, token: &str, function: &str, body: Value) -> (Outcome, Vec<u8>) {
        let started = Instant::now();
        let resp = self
            .client
            .post(format!("{}/v1/invoke/{function}", self.host.url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
        let took = started.elapsed();
        let code = if status == 200 {
            "ok".to_string()
        } else {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!("{status}: not JSON: {}", String::from_utf8_lossy(&bytes))
            });
            v["code"].as_str().unwrap_or("?").to_string()
        };
        (Outcome::of(status, &code, took), bytes)
    }

    async fn attack(&self, function: &str, body: Value) -> Outcome {
        self.call(ATTACKER, function, body).await.0
    }

    /// One victim call: it must succeed.
    async fn victim(&self) -> f64 {
        self.victim_timed().await.0
    }

    /// One victim call and its Server-Timing.
    async fn victim_timed(&self) -> (f64, hapi_wire::ServerTiming) {
        let started = Instant::now();
        let resp = self
            .client
            .post(format!("{}/v1/invoke/feature-extract", self.host.url))
            .bearer_auth(VICTIM)
            .json(&victim_body())
            .send()
            .await
            .expect("request");
        let timing = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .map(hapi_wire::ServerTiming::parse)
            .unwrap_or_default();
        let status = resp.status().as_u16();
        let body = resp.bytes().await.unwrap_or_default();
        assert_eq!(
            status,
            200,
            "the victim was not served: {}",
            String::from_utf8_lossy(&body)
        );
        (started.elapsed().as_secs_f64() * 1e3, timing)
    }

    async fn victim_median(&self, n: usize) -> f64 {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.victim().await);
        }
        median(v)
    }

    /// Runs `attack` while the victim calls in a closed loop; the victim's median meanwhile.
    async fn beside<F: Future<Output = Outcome>>(&self, attack: F) -> (Outcome, f64) {
        let done = std::sync::atomic::AtomicBool::new(false);
        let attack = async {
            let o = attack.await;
            done.store(true, std::sync::atomic::Ordering::Release);
            o
        };
        let victim = async {
            // Let the attack get going first.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (mut v, mut t) = (Vec::new(), Vec::new());
            while !done.load(std::sync::atomic::Ordering::Acquire) || v.len() < 5 {
                let (ms, timing) = self.victim_timed().await;
                v.push(ms);
                t.push(timing);
            }
            let stage = |f: fn(&hapi_wire::ServerTiming) -> f64| {
                median(t.iter().map(|x| f(x) * 1e3).collect())
            };
            eprintln!(
                "   victim beside it: {} calls, medians: decode {:.1} ms, queue {:.1} ms, compute {:.1} ms, total {:.1} ms",
                v.len(),
                stage(|x| x.decode),
                stage(|x| x.queue),
                stage(|x| x.compute),
                stage(|x| x.total)
            );
            median(v)
        };
        tokio::join!(attack, victim)
    }

    /// Marks the row's peak now: the attack (connections held) is in place, and what follows
    /// is the light tenant's own compute. Its working set lands in the arena of whichever
    /// device worker runs it, and the host trims freed memory every few seconds, so one to
    /// three cold working sets (20-60 MiB) would otherwise be counted as the attack's.
    async fn attack_in_place(&self) {
        // The host has accepted and read what the connections sent.
        tokio::time::sleep(Duration::from_millis(150)).await;
        *self.mark.lock().expect("mark") = Some(self.rss.peak());
    }

    /// Records a row: runs `f`, measures the host's resident-set growth over its baseline,
    /// then the victim, and checks every promise.
    async fn row<F: Future<Output = (Outcome, Option<f64>)>>(
        &self,
        class: u8,
        attack: &str,
        bound: u64,
        limit: Option<Duration>,
        f: F,
    ) {
        let base = self.rss.now();
        self.rss.reset_peak();
        *self.mark.lock().expect("mark") = None;
        let (outcome, during) = f.await;
        let marked = self.mark.lock().expect("mark").take();
        let growth = marked
            .unwrap_or_else(|| self.rss.peak())
            .saturating_sub(base);
        let victim_ms = match during {
            Some(ms) => ms,
            None => self.victim_median(5).await,
        };
        let ratio = victim_ms / self.solo_ms;
        eprintln!(
            "{class:>2} {attack}: {} {} in {:.2}s {}; +{:.0} MiB (bound {:.0}); victim {victim_ms:.0} ms ({ratio:.2}x)",
            outcome.status,
            outcome.code,
            outcome.took.as_secs_f64(),
            outcome.note,
            growth as f64 / MIB as f64,
            bound as f64 / MIB as f64
        );
        assert!(outcome.status < 500, "{attack}: a 5xx: {outcome:?}");
        assert!(
            growth <= bound,
            "{attack}: the host grew by {} MiB, over {} MiB",
            growth / MIB,
            bound / MIB
        );
        if let Some(limit) = limit {
            assert!(
                outcome.took <= limit + LATE,
                "{attack}: took {:?} for a {limit:?} limit",
                outcome.took
            );
        }
        // The goal is 3x (the table marks rows past it); on a shared CI machine one attack's
        // median moves too much to fail on it. Starvation, which the test does fail on, is
        // an order of magnitude.
        assert!(
            ratio <= STARVED,
            "{attack}: the victim's median {victim_ms:.0} ms is {ratio:.2}x its solo {:.0} ms",
            self.solo_ms
        );
        self.rows.lock().expect("rows").push(Row {
            class,
            attack: attack.to_string(),
            outcome,
            growth,
            bound,
            limit,
            victim_ms,
            ratio,
        });
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = common::metrics_text(&self.client, &self.host.url, OPERATOR).await;
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn table(&self) {
        eprintln!(
            "\n| class | attack | status, code | time (limit) | host RSS growth (bound) | light tenant median (x solo {:.0} ms) |",
            self.solo_ms
        );
        eprintln!("|---|---|---|---|---|---|");
        for r in self.rows.lock().expect("rows").iter() {
            eprintln!(
                "| {} | {} | {}`{}`{} | {:.2} s{} | {:.0} MiB ({:.0}) | {:.0} ms ({:.2}x{}) |",
                r.class,
                r.attack,
                // Status 0: the outcome is not one HTTP answer (connections, a CLI).
                if r.outcome.status == 0 {
                    String::new()
                } else {
                    format!("{} ", r.outcome.status)
                },
                r.outcome.code,
                if r.outcome.note.is_empty() {
                    String::new()
                } else {
                    format!(", {}", r.outcome.note)
                },
                r.outcome.took.as_secs_f64(),
                r.limit
                    .map_or(String::new(), |l| format!(" ({:.1} s)", l.as_secs_f64())),
                r.growth as f64 / MIB as f64,
                r.bound as f64 / MIB as f64,
                r.victim_ms,
                r.ratio,
                if r.ratio > FAIR {
                    ", over the goal"
                } else {
                    ""
                }
            );
        }
    }
}

/// Sends `raw` on `n` connections from `source` addresses and keeps them open; returns them.
async fn hold(addr: &str, sources: &[[u8; 4]], n: usize, raw: &[u8]) -> Vec<Held> {
    let mut held = Vec::new();
    for i in 0..n {
        let src = sources[i % sources.len()];
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from((src, 0)))
            .expect("bind a loopback source");
        let Ok(mut stream) = socket.connect(addr.parse().expect("addr")).await else {
            continue;
        };
        if stream.write_all(raw).await.is_ok() {
            held.push(Held {
                stream,
                sent: Instant::now(),
            });
        }
    }
    held
}

/// A connection `hold` opened, and when its bytes were sent: the host's timeouts run from
/// then, not from the start of a row that opened hundreds of connections before it.
struct Held {
    stream: tokio::net::TcpStream,
    sent: Instant,
}

/// Sends `request` on a fresh connection and reads the whole response: its status and body.
async fn raw_request(addr: &str, request: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// How many of `conns` the host has closed (a read sees EOF or an error) within `wait`, and
/// the longest any of them stayed open after its bytes were sent. Every connection is read at
/// once, so each close is seen when it happens, not after the ones before it.
async fn closed(conns: Vec<Held>, wait: Duration) -> (usize, Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    let mut reads = tokio::task::JoinSet::new();
    for Held { mut stream, sent } in conns {
        reads.spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return Some(sent.elapsed()),
                    Ok(Ok(_)) => continue, // a response (408): read on to the close
                    Err(_) => return None,
                }
            }
        });
    }
    let (mut closed, mut longest) = (0, Duration::ZERO);
    while let Some(held) = reads.join_next().await {
        if let Some(held) = held.expect("a reader task") {
            closed += 1;
            longest = longest.max(held);
        }
    }
    (closed, longest)
}

/// The host binary under test.
fn binary() -> std::path::PathBuf {
    hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host"))
}

/// Writes the attack policy (device budget `budget`) to `dir/policy.toml` and serves it.
fn serve(dir: &Path, store: &Path, budget: u64) -> HostProcess {
    let policy_path = dir.join("policy.toml");
    std::fs::write(&policy_path, policy(dir, store, budget)).expect("policy");
    HostProcess::serve(&binary(), &policy_path, "127.0.0.1:0")
}

/// The tests here run one at a time: each measures a host process's memory and latency.
fn serial() -> &'static tokio::sync::Mutex<()> {
    static M: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
    M.get_or_init(|| tokio::sync::Mutex::new(()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_tenant_cannot_break_isolation() {
    let _one = serial().lock().await;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    common::write_store(&store);
    // The large-call attacks read 192 objects; the samples are small PNGs. The store-work rows
    // list a directory of 20,000 objects and read one of 1 MiB.
    let many = store.join("datasets/fashion-mnist/many");
    std::fs::create_dir_all(&many).expect("mkdir");
    for i in 0..20_000 {
        std::fs::write(many.join(format!("{i:05}")), b"x").expect("write");
    }
    std::fs::write(many.join("large"), vec![7u8; 1 << 20]).expect("write");
    let host = serve(dir.path(), &store, BUDGET);
    let rss = Rss(host.child.id());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(16)
        .build()
        .expect("client");
    let mut s = Suite {
        host,
        rss,
        client,
        solo_ms: 0.0,
        rows: std::sync::Mutex::default(),
        mark: std::sync::Mutex::default(),
    };
    // Warm: the victim's model is loaded and measured; the attacker's guests instantiated once.
    for _ in 0..3 {
        s.victim().await;
    }
    let mut solo = Vec::new();
    for _ in 0..9 {
        solo.push(s.victim_timed().await);
    }
    s.solo_ms = median(solo.iter().map(|x| x.0).collect());
    let stage = |f: fn(&hapi_wire::ServerTiming) -> f64| {
        median(solo.iter().map(|x| f(&x.1) * 1e3).collect())
    };
    eprintln!(
        "victim solo median: {:.1} ms (decode {:.1}, queue {:.1}, compute {:.1})",
        s.solo_ms,
        stage(|x| x.decode),
        stage(|x| x.queue),
        stage(|x| x.compute)
    );
    let addr = s.host.url.trim_start_matches("http://").to_string();
    let bound = 2 * ATTACKER_MEMORY + 64 * MIB;
    let limit = Some(ATTACKER_TIMEOUT);

    // 1. Files outside a tenant's reach.
    s.row(
        1,
        "DELETE /v1/functions/..%2Fvictim%2Ffeature-extract",
        bound,
        None,
        async {
            let started = Instant::now();
            let resp = s
                .client
                .delete(format!(
                    "{}/v1/functions/..%2Fvictim%2Ffeature-extract",
                    s.host.url
                ))
                .bearer_auth(ATTACKER)
                .send()
                .await
                .expect("delete");
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.expect("JSON");
            (
                Outcome::of(status, v["code"].as_str().unwrap_or("?"), started.elapsed()),
                None,
            )
        },
    )
    .await;

    // 2-4, 8: single calls of the attacker, each a row: class, attack, function, body.
    let input = (64 * 3 * 224 * 224 * 4).to_string();
    // More than this machine computes in the attacker's 1 s (32 samples took 0.81-1.0 s).
    let big = (48 * 3 * 224 * 224 * 4).to_string();
    let long_segment = format!("fashion-mnist/{}.png", "a".repeat(300));
    let offset = (u64::MAX - 5).to_string();
    let prefix = format!("fashion-mnist/{}/", "p".repeat(300));
    let graph = |name: &str, dims: &str, bytes: &str| {
        hostile(
            "graph",
            &[("graph", name), ("dims", dims), ("bytes", bytes)],
            &[],
        )
    };
    let single: Vec<(u8, &str, &str, Value)> = vec![
        (
            2,
            "guest allocates 1 GiB",
            "hostile",
            hostile("alloc", &[("bytes", "1073741824")], &[]),
        ),
        (
            2,
            "64 tensors of 4 MiB kept in the host",
            "hostile",
            hostile("tensors", &[("count", "64"), ("bytes", "4194304")], &[]),
        ),
        (
            2,
            "112 graph names of 8 MiB, error values kept",
            "hostile",
            hostile("names", &[("count", "112"), ("bytes", "8388608")], &[]),
        ),
        (
            2,
            "10 tensors of 8M dimensions kept",
            "hostile",
            hostile("dims", &[("count", "10"), ("rank", "8000000")], &[]),
        ),
        (
            2,
            "compute of 64 samples (205 MB of output)",
            "hostile",
            graph("resnet18[0..1]", "64,3,224,224", &input),
        ),
        (3, "endless loop", "hostile", hostile("loop", &[], &[])),
        (
            3,
            "8 s sleep in a host call (wasi:clocks)",
            "sleeper",
            json!({"bucket": "b", "keys": [], "model": "m", "split": 0, "options": {"ms": "8000"}}),
        ),
        (
            3,
            "one compute of 48 samples through all of resnet18",
            "hostile",
            graph("resnet18[0..15]", "48,3,224,224", &big),
        ),
        (
            4,
            "a model that can never fit (vgg11, 507 MiB, on a 256 MiB budget)",
            "hostile",
            graph("vgg11[0..1]", "1,3,224,224", "602112"),
        ),
        (
            8,
            "a key with a 300-byte segment",
            "hostile",
            hostile("read", &[], &[&long_segment]),
        ),
        (
            8,
            "a key below an object",
            "hostile",
            hostile("read", &[], &["fashion-mnist/small.bin/x"]),
        ),
        (
            8,
            "get-range at offset 2^64 - 6",
            "hostile",
            hostile(
                "range",
                &[("offset", &offset), ("length", "100")],
                &["fashion-mnist/small.bin"],
            ),
        ),
        (
            8,
            "list under a 300-byte prefix segment",
            "hostile",
            hostile("list", &[("prefix", &prefix)], &[]),
        ),
        (
            8,
            "a guest that claims a store failure",
            "hostile",
            hostile("claim-io", &[], &[]),
        ),
    ];
    for (class, attack, function, body) in single {
        s.row(class, attack, bound, limit, async {
            (s.attack(function, body).await, None)
        })
        .await;
    }

    // 3. The store's work for a call stops at the time limit too, and is answered as the time
    // limit, not as a store failure.
    s.row(
        3,
        "listings of 20,000 objects, 1,000 in a row",
        bound,
        limit,
        async {
            let o = s
                .attack(
                    "hostile",
                    hostile(
                        "list",
                        &[
                            ("prefix", "fashion-mnist/many/"),
                            ("limit", "1"),
                            ("count", "1000"),
                        ],
                        &[],
                    ),
                )
                .await;
            assert_eq!(
                (o.status, o.code.as_str()),
                (422, "time_limit_exceeded"),
                "{o:?}"
            );
            (o, None)
        },
    )
    .await;

    // 2. Host memory: held across many calls, and many bombs at once.
    let small = (8 * 3 * 224 * 224 * 4).to_string();
    s.row(
        2,
        "outputs of 40 computes kept, pooled beside the victim",
        bound,
        limit,
        async {
            let (o, v) = s
                .beside(s.attack(
                    "hostile",
                    hostile(
                        "graph",
                        &[
                            ("graph", "resnet18[0..4]"),
                            ("dims", "8,3,224,224"),
                            ("bytes", &small),
                            ("count", "40"),
                        ],
                        &[],
                    ),
                ))
                .await;
            (o, Some(v))
        },
    )
    .await;
    s.row(
        2,
        "8 memory bombs at once (concurrency 1)",
        bound,
        Some(8 * ATTACKER_TIMEOUT),
        async {
            let started = Instant::now();
            let bombs = (0..8).map(|_| {
                s.attack(
                    "hostile",
                    hostile("tensors", &[("count", "64"), ("bytes", "4194304")], &[]),
                )
            });
            let all = futures::future::join_all(bombs).await;
            let worst = all
                .iter()
                .max_by_key(|o| o.status)
                .cloned()
                .expect("outcomes");
            let codes: Vec<&str> = all.iter().map(|o| o.code.as_str()).collect();
            (
                Outcome::of(worst.status, &worst.code, started.elapsed())
                    .note(format!("{codes:?}")),
                None,
            )
        },
    )
    .await;

    // 5. Fairness: the heavy tenant's calls, as many at a time as it may run, again and again
    // beside the light tenant's: by device time (a flood), by worker time (guests that never
    // wait), and by the host's own work for a call, which is the tenant's, not free CPU beside
    // its share (a walk's directory entries and their metadata, a read's opens and copies).
    let heavy_input = (48 * 3 * 224 * 224 * 4).to_string();
    let loops = [
        (
            "flood: 4 x 48-sample calls at a time, for 6 s",
            6,
            hostile(
                "graph",
                &[
                    ("graph", "resnet18[0..4]"),
                    ("dims", "48,3,224,224"),
                    ("bytes", &heavy_input),
                ],
                &[],
            ),
        ),
        (
            "4 guests spinning at a time, for 4 s",
            4,
            hostile("spin", &[("iterations", "300000000")], &[]),
        ),
        (
            "4 guests listing 20,000 objects (1 key asked) again and again, for 4 s",
            4,
            hostile(
                "list",
                &[
                    ("prefix", "fashion-mnist/many/"),
                    ("limit", "1"),
                    ("count", "20"),
                ],
                &[],
            ),
        ),
        (
            "4 guests reading a 1 MiB object again and again, for 4 s",
            4,
            hostile("reread", &[("count", "200")], &["fashion-mnist/many/large"]),
        ),
    ];
    for (attack, seconds, body) in loops {
        s.row(
            5,
            attack,
            HEAVY_CONCURRENCY * 2 * HEAVY_MEMORY + 64 * MIB,
            None,
            async {
                let heavy = s.heavy_loops(Duration::from_secs(seconds), body);
                let (o, v) = s.beside(heavy).await;
                (o, Some(v))
            },
        )
        .await;
    }
    let huge = (192 * 3 * 224 * 224 * 4).to_string();
    s.row(
        5,
        "one call of 192 samples",
        2 * HEAVY_MEMORY + 64 * MIB,
        None,
        async {
            let (o, v) = s
                .beside(async {
                    s.call(
                        HEAVY,
                        "hostile",
                        hostile(
                            "graph",
                            &[
                                ("graph", "resnet18[0..4]"),
                                ("dims", "192,3,224,224"),
                                ("bytes", &huge),
                            ],
                            &[],
                        ),
                    )
                    .await
                    .0
                })
                .await;
            (o, Some(v))
        },
    )
    .await;

    // 6. Device memory charged where it is used. The weights stay within the budget however
    // many graphs are loaded (alexnet, the first, does not fit beside the light tenant's
    // resnet18, which stays: the call waits and is refused at its time limit).
    s.row(
        6,
        "loads alexnet, lite0 and resnet18 graphs (256 MiB budget)",
        BUDGET + bound,
        limit,
        async {
            let evicted = s.metric("hapi_device_evictions_total").await;
            let o = s
                .attack(
                    "hostile",
                    hostile(
                        "graphs",
                        &[(
                            "graphs",
                            "alexnet[0..2],efficientnet_lite0[0..2],resnet18[0..2]",
                        )],
                        &[],
                    ),
                )
                .await;
            let weights = s.metric("hapi_device_weights_bytes").await;
            assert!(
                weights <= BUDGET as f64,
                "weights {weights} over the budget"
            );
            let now = s.metric("hapi_device_evictions_total").await;
            let note = format!(
                "weights {:.0} MiB, {} evictions",
                weights / MIB as f64,
                now - evicted
            );
            (o.note(note), None)
        },
    )
    .await;
    // The light tenant's resnet18 (46 MiB) and alexnet (233 MiB) do not fit the budget
    // together: a load of alexnet must not unload the model the light tenant keeps using,
    // which holds less than its share. With least-recently-used eviction whoever's (the
    // host before `resident_for`), each of these loads unloaded it and the light tenant
    // reloaded it. Nothing before this row loads alexnet (the row above is refused), so
    // every attempt is a load.
    s.row(
        6,
        "loads alexnet again and again beside the light tenant's resnet18",
        BUDGET + bound,
        None,
        async {
            let count = |name| s.metric(name);
            let (evicted, loads, deferred) = (
                count("hapi_device_evictions_total").await,
                count("hapi_device_loads_total").await,
                count("hapi_device_deferred_loads_total").await,
            );
            let attack = async {
                let started = Instant::now();
                let (mut loaded, mut refused) = (0, 0);
                let mut last = None;
                while started.elapsed() < Duration::from_secs(4) {
                    let graphs = hostile("graphs", &[("graphs", "alexnet[0..2]")], &[]);
                    let o = s.attack("hostile", graphs).await;
                    assert!(o.took <= ATTACKER_TIMEOUT + LATE, "{o:?}");
                    if o.status == 200 {
                        loaded += 1;
                    } else {
                        refused += 1;
                    }
                    last = Some(o);
                }
                let last = last.expect("one attempt");
                Outcome::of(last.status, &last.code, started.elapsed())
                    .note(format!("{loaded} loaded, {refused} refused"))
            };
            let (o, v) = s.beside(attack).await;
            let unloaded = count("hapi_device_evictions_total").await - evicted;
            let loads = count("hapi_device_loads_total").await - loads;
            let deferred = count("hapi_device_deferred_loads_total").await - deferred;
            assert_eq!(
                unloaded, 0.0,
                "the attacker's loads unloaded models ({loads} loads): {o:?}"
            );
            assert!(deferred >= 1.0, "no load was deferred: {o:?}");
            let note = format!(
                "{}; {loads} loads, {unloaded} unloaded, {deferred} deferred",
                o.note
            );
            (o.note(note), Some(v))
        },
    )
    .await;

    // 7. Output caps count everything.
    s.row(
        7,
        "a tensor of 8M dimensions and 1 byte of data",
        bound,
        limit,
        async {
            let (o, body) = s
                .call(
                    ATTACKER,
                    "hostile",
                    hostile("wide-output", &[("rank", "8000000")], &[]),
                )
                .await;
            assert!(body.len() < 2048, "a {} byte body", body.len());
            (o.note(format!("{} byte body", body.len())), None)
        },
    )
    .await;
    s.row(7, "a 24 MiB error message", bound, limit, async {
        let (o, body) = s
            .call(
                ATTACKER,
                "hostile",
                hostile("long-error", &[("bytes", "25165824")], &[]),
            )
            .await;
        assert!(body.len() <= 8192, "a {} byte body", body.len());
        (o.note(format!("{} byte body", body.len())), None)
    })
    .await;

    // The host's own work on an output counts as the invocation's time, and gives the worker
    // back to the others as the guest's code does: 12.5 M values to quantize a call, four at a
    // time, beside the light tenant.
    s.row(
        7,
        "int8 of 50 MB f32 outputs, 4 at a time for 3 s",
        HEAVY_CONCURRENCY * HEAVY_MEMORY + 64 * MIB,
        None,
        async {
            let mut body = hostile("f32-output", &[("bytes", "50000000")], &[]);
            body["quantize"] = json!("int8");
            let started = Instant::now();
            let calls = std::sync::atomic::AtomicUsize::new(0);
            let (outcome, victim) = s
                .beside(async {
                    let one = || async {
                        let mut last = None;
                        while started.elapsed() < Duration::from_secs(3) {
                            let (o, bytes) = s.call(HEAVY, "hostile", body.clone()).await;
                            assert_eq!(o.status, 200, "{o:?}");
                            // A quarter of the f32 bytes, and a scale per channel.
                            let n = 50_000_000 / (64 * 32 * 32 * 4);
                            assert!(
                                bytes.len() >= n * 64 * (32 * 32 + 4),
                                "{} bytes",
                                bytes.len()
                            );
                            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            last = Some(o);
                        }
                        last.expect("at least one call")
                    };
                    let (a, _, _, _) = tokio::join!(one(), one(), one(), one());
                    a
                })
                .await;
            let calls = calls.load(std::sync::atomic::Ordering::Relaxed);
            (outcome.note(format!("{calls} calls")), Some(victim))
        },
    )
    .await;

    // 9. HTTP edges.
    let sources: Vec<[u8; 4]> = (2..=6).map(|i| [127, 0, 0, i]).collect();
    let withheld = format!(
        "POST /v1/invoke/hostile HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ATTACKER}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    // A request's body is read once the tenant has a slot for it: the attacker's one running
    // and eight queued wait their turn (no byte of their bodies held), each then given the body
    // timeout; the other 291 are refused at once.
    let places = 1 + 8;
    s.row(
        9,
        "300 connections withholding their body",
        64 * MIB,
        Some(places * BODY_TIMEOUT),
        async {
            let refused = "hapi_refused_total{tenant=\"attacker\",endpoint=\"invoke\"";
            let refused_before = s.metric(refused).await;
            let conns = hold(&addr, &sources, 300, withheld.as_bytes()).await;
            let health = s
                .client
                .get(format!("{}/healthz", s.host.url))
                .send()
                .await
                .expect("healthz")
                .status();
            assert_eq!(health, 200);
            s.attack_in_place().await;
            let victim = s.victim_median(3).await;
            let n = conns.len();
            let (gone, longest) =
                closed(conns, places * BODY_TIMEOUT + LATE + Duration::from_secs(1)).await;
            assert_eq!(gone, n, "{gone} of {n} closed");
            // Every one of them is charged to the attacker as refused (busy, or its body
            // timeout), none as an invocation.
            let charged = s.metric(refused).await - refused_before;
            assert_eq!(charged as usize, n, "refusals charged to the attacker");
            (
                Outcome::of(408, "request_timeout", longest).note(format!(
                    "{gone}/{n} closed; all but the tenant's {places} (1 running, 8 queued) refused (429) at their body timeout, those {places} in turn"
                )),
                Some(victim),
            )
        },
    )
    .await;
    // A head left unfinished holds its connection until the header timeout, and what hyper
    // buffered of it: up to its read buffer's limit (about 400 KiB unless set), from anyone,
    // authenticated or not.
    let mut long_head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_vec();
    long_head.resize(400_000, b'a');
    // Just under the 64 KiB heads were allowed: 300 of them held about 19 MiB for their header
    // timeout, and a host's 1,024 connections 64 MiB, renewed as they timed out.
    let mut held_head = long_head.clone();
    held_head.truncate(60_000);
    for (attack, head, bound) in [
        (
            "300 connections with half-sent headers",
            &b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "[..],
            64 * MIB,
        ),
        (
            "300 connections sending 400 KB of unfinished headers",
            &long_head[..],
            64 * MIB,
        ),
        (
            "300 connections holding 60 KB of unfinished headers each",
            &held_head[..],
            8 * MIB,
        ),
    ] {
        s.row(9, attack, bound, Some(HEADER_TIMEOUT), async {
            let conns = hold(&addr, &sources, 300, head).await;
            s.attack_in_place().await;
            let victim = s.victim_median(3).await;
            let n = conns.len();
            let (gone, longest) =
                closed(conns, HEADER_TIMEOUT + LATE + Duration::from_secs(1)).await;
            assert_eq!(gone, n, "{gone} of {n} closed");
            (
                Outcome::of(0, "closed", longest).note(format!("{gone}/{n} closed")),
                Some(victim),
            )
        })
        .await;
    }
    s.row(
        9,
        "48 invocations with 4 MiB bodies at once (concurrency 1)",
        // The one admitted holds its body and what is parsed from it (it is then refused: an
        // option over 4 KiB); the waiting and refused ones hold none of theirs, only the read
        // buffers of connections whose bodies are being dropped. 128 MiB: the 48 bodies alone
        // are 192 MiB, which reading every body before admitting it would hold.
        128 * MIB,
        None,
        async {
            let started = Instant::now();
            let mut body = hostile("none", &[], &[]);
            body["options"]["pad"] = "x".repeat((4 << 20) - 1024).into();
            let body = body.to_string();
            let calls = (0..48).map(|_| {
                let (client, url, body) = (
                    s.client.clone(),
                    format!("{}/v1/invoke/hostile", s.host.url),
                    body.clone(),
                );
                async move {
                    client
                        .post(url)
                        .bearer_auth(ATTACKER)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16())
                }
            });
            let (statuses, victim) =
                tokio::join!(futures::future::join_all(calls), s.victim_median(3));
            // Every one answered (0: the connection broke), none with a 5xx.
            assert!(
                statuses.iter().all(|&c| (400..500).contains(&c)),
                "{statuses:?}"
            );
            let refused = statuses.iter().filter(|&&c| c == 429).count();
            (
                Outcome::of(429, "busy", started.elapsed()).note(format!(
                    "{refused} refused, their bodies read and dropped; {} read one at a time",
                    statuses.len() - refused
                )),
                Some(victim),
            )
        },
    )
    .await;
    s.row(
        9,
        "200 connections from one address",
        64 * MIB,
        None,
        async {
            let started = Instant::now();
            let conns = hold(&addr, &[[127, 0, 0, 7]], 200, b"").await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let open = s.metric("hapi_http_connections").await as usize;
            assert!(open <= PER_CLIENT + 16, "{open} connections open");
            s.attack_in_place().await;
            let victim = s.victim_median(3).await;
            drop(conns);
            (
                Outcome::of(0, "capped", started.elapsed()).note(format!("{open} open of 200")),
                Some(victim),
            )
        },
    )
    .await;
    s.row(9, "a client that reads none of a 200 MB response", 2 * HEAVY_MEMORY + 64 * MIB, None, async {
        let started = Instant::now();
        let req = format!(
            "POST /v1/invoke/hostile HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HEAVY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            hostile("output", &[("bytes", "200000000")], &[]).to_string().len(),
            hostile("output", &[("bytes", "200000000")], &[])
        );
        let mut conns = hold(&addr, &[[127, 0, 0, 8]], 1, req.as_bytes()).await;
        // Never read: the host gives up after the idle timeout.
        tokio::time::sleep(IDLE_TIMEOUT + Duration::from_secs(2)).await;
        let mut buf = vec![0u8; 1 << 20];
        let (mut got, mut head) = (0usize, Vec::new());
        loop {
            match tokio::time::timeout(Duration::from_secs(5), conns[0].stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                Ok(Ok(n)) => {
                    if head.len() < 12 {
                        head.extend_from_slice(&buf[..n.min(12)]);
                    }
                    got += n;
                }
            }
        }
        // The response the host gave up on was the output, not an error.
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
        assert!(got < 200_000_000, "the whole response came through: {got}");
        (Outcome::of(200, "dropped", started.elapsed()).note(format!("{} MB read, then closed", got / 1_000_000)), None)
    })
    .await;
    // A response waiting for its client is the tenant's: it keeps its slot until it is sent.
    // Else a client that asks again as soon as each answer starts, reading none of them, makes
    // the host hold a response per request for the idle timeout, whatever its concurrency.
    let mut started_unread = Vec::new();
    s.row(9, "4 clients that ask again as each 100 MB response starts and read none", 2 * HEAVY_MEMORY + HEAVY_CONCURRENCY * 64 * MIB, None, async {
        let started = Instant::now();
        let body = hostile("output", &[("bytes", "100000000")], &[]).to_string();
        let req = format!(
            "POST /v1/invoke/hostile HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HEAVY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        // Well before the first unread response's idle timeout can close its connection.
        let until = tokio::time::Instant::now() + IDLE_TIMEOUT - Duration::from_millis(500);
        let clients = (0..HEAVY_CONCURRENCY).map(|_| {
            let (addr, req) = (addr.clone(), req.clone());
            async move {
                let (mut answered, mut held) = (Vec::new(), Vec::new());
                loop {
                    let mut conn = hold(&addr, &[[127, 0, 0, 9]], 1, req.as_bytes()).await;
                    let Some(mut c) = conn.pop() else { break };
                    // The status line only: the rest stays unread.
                    let mut line = [0u8; 12];
                    match tokio::time::timeout_at(until, c.stream.read_exact(&mut line)).await {
                        Ok(Ok(_)) => answered.push(String::from_utf8_lossy(&line[9..]).into_owned()),
                        _ => {
                            held.push(c);
                            break;
                        }
                    }
                    held.push(c);
                }
                (answered, held)
            }
        });
        let results = futures::future::join_all(clients).await;
        s.attack_in_place().await;
        started_unread = results.iter().flat_map(|r| r.0.clone()).collect();
        let ok = started_unread.iter().filter(|c| *c == "200").count();
        drop(results);
        (
            Outcome::of(200, "held", started.elapsed()).note(format!(
                "{ok} responses started in {:.1} s (concurrency {HEAVY_CONCURRENCY}), the next calls waiting for their slots",
                (IDLE_TIMEOUT - Duration::from_millis(500)).as_secs_f64()
            )),
            None,
        )
    })
    .await;
    assert!(
        started_unread.iter().filter(|c| *c == "200").count() as u64 <= HEAVY_CONCURRENCY,
        "more unread responses held at once than the tenant's concurrency {HEAVY_CONCURRENCY}: {started_unread:?}"
    );
    s.row(9, "405, 413, bad path, no route, metrics without the operator", 64 * MIB, None, async {
        let started = Instant::now();
        let url = &s.host.url;
        let checks = [
            (s.client.get(format!("{url}/v1/invoke/hostile")).bearer_auth(ATTACKER), 405, "method_not_allowed"),
            (s.client.post(format!("{url}/v1/invoke/a%FF%FEb")).bearer_auth(ATTACKER).body("{}"), 400, "bad_name"),
            (s.client.get(format!("{url}/nothing/here")), 404, "no_route"),
            (s.client.get(format!("{url}/metrics")), 401, "unauthenticated"),
            (s.client.get(format!("{url}/metrics")).bearer_auth(ATTACKER), 403, "forbidden"),
            (s.client.get(format!("{url}/v1/functions")).header("authorization", format!("bEaReR {ATTACKER}")), 200, ""),
        ];
        for (req, status, code) in checks {
            let resp = req.send().await.expect("request");
            assert_eq!(resp.status().as_u16(), status, "{code}");
            if !code.is_empty() {
                let v: Value = resp.json().await.expect("a JSON error");
                assert_eq!(v["code"], code);
            }
        }
        // A body declared over the invoke limit: refused before it is read.
        let (status, body) = raw_request(
            &addr,
            &format!("POST /v1/invoke/hostile HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ATTACKER}\r\nContent-Length: 5000000\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(status, 413, "{body}");
        assert!(body.contains("\"body_too_large\""), "{body}");
        (Outcome::of(400, "json", started.elapsed()).note("all JSON, with codes"), None)
    })
    .await;

    // 10. The deploy path.
    let put = |token: &'static str, name: String, body: Vec<u8>| {
        let client = s.client.clone();
        let url = format!("{}/v1/functions/{name}", s.host.url);
        async move {
            let started = Instant::now();
            let resp = client
                .put(url)
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .expect("put");
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            Outcome::of(
                status,
                v["code"].as_str().unwrap_or("ok"),
                started.elapsed(),
            )
        }
    };
    let bomb = guest_with("hostile", &[module(3, 7_000_000)]);
    s.row(
        10,
        "a 21 MB component of three 7 MB function bodies",
        bound,
        None,
        async { (put(ATTACKER, "bomb".into(), bomb.clone()).await, None) },
    )
    .await;
    let heavy_code = guest_with(
        "hostile",
        &[module(
            15,
            hapi_host::wasm::compile::MAX_FUNCTION_BODY - 100,
        )],
    );
    let hostile_bytes = std::fs::read(guest("hostile")).expect("hostile");
    let solo_deploy = put(VICTIM, "mine".into(), hostile_bytes.clone()).await;
    assert_eq!(solo_deploy.status, 201, "{solo_deploy:?}");
    s.row(
        10,
        "6 uploads of 7.5 MB of code at once, beside another tenant's deploy",
        bound,
        None,
        async {
            let started = Instant::now();
            let bombs = (0..6).map(|i| put(ATTACKER, format!("big{i}"), heavy_code.clone()));
            let victim_deploy = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Other bytes than before (a custom section), so that they are compiled again.
                let mut fresh = hostile_bytes.clone();
                section(0, b"\x05fresh", &mut fresh);
                put(VICTIM, "mine".into(), fresh).await
            };
            let (all, mine) = tokio::join!(futures::future::join_all(bombs), victim_deploy);
            assert_eq!(mine.status, 201, "{mine:?}");
            let codes: Vec<String> = all
                .iter()
                .map(|o| format!("{} {}", o.status, o.code))
                .collect();
            let worst = all
                .iter()
                .max_by_key(|o| o.status)
                .cloned()
                .expect("outcomes");
            let note = format!(
                "{codes:?}; the other tenant's deploy {:.2} s (alone {:.2} s)",
                mine.took.as_secs_f64(),
                solo_deploy.took.as_secs_f64()
            );
            (
                Outcome::of(worst.status, &worst.code, started.elapsed()).note(note),
                None,
            )
        },
    )
    .await;

    s.row(
        10,
        "12 uploads of 7.5 MB of code, each client hanging up 0.3 s after its last byte",
        bound,
        None,
        async {
            let started = Instant::now();
            let addr = s.host.url.trim_start_matches("http://").to_string();
            let mut answers = Vec::new();
            for i in 0..12 {
                // Other bytes each time (a custom section), so that each is compiled afresh.
                let mut code = heavy_code.clone();
                let tag = format!("gone{i:02}");
                section(0, &[&[tag.len() as u8], tag.as_bytes()].concat(), &mut code);
                let head = format!(
                    "PUT /v1/functions/gone{i} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ATTACKER}\r\nContent-Length: {}\r\n\r\n",
                    code.len()
                );
                let mut conn = tokio::net::TcpStream::connect(&addr).await.expect("connect");
                conn.write_all(head.as_bytes()).await.expect("head");
                // A refused upload is answered once its body has been read and dropped; one
                // taken is compiled, and its client hangs up 0.3 s after its last byte.
                let (mut rd, mut wr) = conn.split();
                let write = async {
                    let _ = tokio::time::timeout(Duration::from_secs(10), wr.write_all(&code))
                        .await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                };
                let mut answer = [0u8; 64];
                let answered = tokio::select! {
                    r = rd.read(&mut answer) => match r {
                        Ok(n) if n > 0 => String::from_utf8_lossy(&answer[..n])
                            .split(' ')
                            .nth(1)
                            .unwrap_or("?")
                            .to_string(),
                        other => format!("closed ({other:?})"),
                    },
                    () = write => "compiling".to_string(),
                };
                answers.push(answered);
                drop(conn);
            }
            // The attacker's next upload is taken once the compiles it left have ended.
            let waited = Instant::now();
            let after = loop {
                let o = put(ATTACKER, "after".into(), hostile_bytes.clone()).await;
                if o.status != 429 || waited.elapsed() > Duration::from_secs(120) {
                    break o;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert_eq!(after.status, 201, "{after:?}");
            let compiling = answers.iter().filter(|a| *a == "compiling").count();
            // One at a time: a compile takes seconds, the twelve uploads about as long, so at
            // most a second is taken after the first ends (when hanging up gave the place back,
            // every one was taken and compiled at once).
            assert!(compiling <= 2, "{answers:?}");
            assert!(
                answers.iter().all(|a| a == "compiling" || a == "429"),
                "{answers:?}"
            );
            let note = format!(
                "{compiling} compiled after its client hung up, {} refused at once (their bytes read and dropped, none kept); the next upload taken {:.2} s later",
                answers.len() - compiling,
                waited.elapsed().as_secs_f64()
            );
            (Outcome::of(429, "deploy_busy", started.elapsed()).note(note), None)
        },
    )
    .await;

    // 11. A reload keeps admission: concurrency 1 holds across SIGHUP.
    s.row(11, "3 calls on concurrency 1 across a SIGHUP", bound, Some(3 * ATTACKER_TIMEOUT), async {
        let started = Instant::now();
        let sleep = || s.attack("sleeper", json!({"bucket": "b", "keys": [], "model": "m", "split": 0, "options": {"ms": "600"}}));
        let hup = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            // SAFETY: kill(2) on the child this test owns.
            unsafe { libc::kill(s.host.child.id() as i32, libc::SIGHUP) };
        };
        let (a, b, c, ()) = tokio::join!(sleep(), sleep(), sleep(), hup);
        for o in [&a, &b, &c] {
            assert_eq!(o.status, 200, "{o:?}");
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1800), "ran at once: {took:?}");
        (Outcome::of(200, "ok", took).note("one at a time"), None)
    })
    .await;

    // 12. Policy values are checked.
    s.row(
        12,
        "`hapi-host check` on a policy with batch_window = \"1h\"",
        64 * MIB,
        None,
        async {
            let started = Instant::now();
            let text = std::fs::read_to_string(dir.path().join("policy.toml"))
                .expect("policy")
                .replace("memory_budget =", "batch_window = \"1h\"\nmemory_budget =");
            let bad = dir.path().join("bad.toml");
            std::fs::write(&bad, text).expect("write");
            let out = std::process::Command::new(binary())
                .args(["check", "--policy"])
                .arg(&bad)
                .output()
                .expect("check");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success());
            assert!(
                err.contains("host.batch_window") && err.contains("line 8"),
                "{err}"
            );
            (
                Outcome::of(0, "refused", started.elapsed())
                    .note("names host.batch_window, line 8"),
                None,
            )
        },
    )
    .await;

    s.table();
    let rss = s.rss.now();
    eprintln!("host resident set at the end: {} MiB", rss / MIB);
}

/// Class 4 at the segment level: with adaptation on, one sample of a segment that can never fit
/// the budget is refused at once; the device serves a segment that fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_that_can_never_fit_is_refused_on_a_real_host() {
    let _one = serial().lock().await;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    common::write_store(&store);
    // Measure lite0's memory model on a first host, then size a budget from it.
    let probe = serve(dir.path(), &store, BUDGET);
    let client = common::http_client();
    let profile: Value = client
        .get(format!(
            "{}/v1/models/efficientnet_lite0/profile",
            probe.url
        ))
        .bearer_auth(VICTIM)
        .send()
        .await
        .expect("profile")
        .json()
        .await
        .expect("json");
    drop(probe);
    let m: hapi_wire::profile::ModelMemory =
        serde_json::from_value(profile["memory"].clone()).expect("memory model");
    let short = m.segment(0..2).run_bytes(1);
    let long = m.segment(0..7).run_bytes(1);
    let budget = m.weights() + short.max(m.one_sample_peak()) + 1;
    assert!(
        m.weights() + long > budget,
        "the long segment fits: {long} for {budget}"
    );
    let host = serve(dir.path(), &store, budget);
    let body = |split: u32| json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "efficientnet_lite0", "split": split});
    let invoke = |split: u32| {
        client
            .post(format!("{}/v1/invoke/feature-extract", host.url))
            .bearer_auth(VICTIM)
            .json(&body(split))
            .send()
    };
    // Warm (load and measure), then the segment that never fits, then one that does.
    let _ = raw(invoke(2).await.expect("warm")).await;
    let started = Instant::now();
    let resp = invoke(7).await.expect("request");
    assert_eq!(resp.status(), 422);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["code"], "does_not_fit_device", "{v}");
    let refused_in = started.elapsed();
    let started = Instant::now();
    let resp = invoke(2).await.expect("request");
    assert_eq!(resp.status(), 200);
    eprintln!(
        " 4 one sample of lite0[0..7) on a {budget} B budget: 422 does_not_fit_device in {:.3} s; lite0[0..2) then served in {:.3} s",
        refused_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    // SIGTERM still stops the host promptly.
    let mut host = host;
    // SAFETY: kill(2) on the child this test owns.
    unsafe { libc::kill(host.child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while host.child.try_wait().expect("wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "hapi-host did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
