//! A storage tier of several nodes on one machine: each node a network namespace with a
//! SeaweedFS volume server and a `hapi-host`, a metadata node (SeaweedFS master, filer and its
//! S3 gateway), and a compute node, all on one bridge, each node's link tc-shaped. Used by
//! `cargo xtask cluster up|down` and by the cluster test. Needs root (`ip netns`, `tc`).
//!
//! Layout, for network `cl` (`cargo xtask cluster`: subnet 10.233.0.0/24; the test's `ct`
//! has 10.234.0.0/24 and names of its own, so it never touches a cluster left running), on
//! bridge `hapi-cl-br` in the root namespace, which can reach every node (the printed URLs
//! work from a shell):
//!
//! | node | namespace | address | runs |
//! |---|---|---|---|
//! | metadata | `hapi-cl-meta` | .2 | weed master :9333, filer :8888, S3 :8333 |
//! | compute | `hapi-cl-compute` | .3 | the trainer (run it with `ip netns exec`) |
//! | storage i (1..) | `hapi-cl-n<i>` | .(10+i) | weed volume :8080, hapi-host :8180 |
//!
//! Objects are replicated on two storage nodes (SeaweedFS replication `001`) when there are
//! two or more. The metadata node's link is not shaped: it stands for the store's front end.
//!
//! **Fenced as a deployment must be.** The master, the filer, the volume servers and the S3
//! gateway's gRPC port answer anyone who reaches them, without credentials (the last reloads
//! the gateway's identities). The metadata node takes connections from the storage cluster only
//! (the metadata and storage nodes, and the bridge's own address: the operator's shell) except
//! on the gateway's S3 port, and a storage node except on its host's port; each node's firewall
//! (`iptables`) resets the rest, the compute node's (a tenant's machine) included. Before, a trainer on the compute node could read, overwrite or
//! delete any object of any bucket through the filer, past every grant of the hosts' policies.
//! What reaches the compute node are the hosts (:8180) and the S3 gateway (:8333), whose
//! credentials are per role: the operator's ([`S3_KEY`], everything), the hosts' ([`HOST_S3_KEY`],
//! read and list) and the tenant's ([`TENANT_S3_KEY`], read and list of bucket
//! [`TENANT_BUCKET`] only), which is what [`Cluster::tenant_s3_env`] gives a trainer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A cluster's names and addresses.
#[derive(Debug, Clone, Copy)]
pub struct Network {
    /// Namespaces are `hapi-<name>-*`, the bridge `hapi-<name>-br`.
    pub name: &'static str,
    /// The first three octets of its addresses.
    pub subnet: &'static str,
}

/// `cargo xtask cluster`'s.
pub const XTASK: Network = Network {
    name: "cl",
    subnet: "10.233.0",
};
/// The cluster test's.
pub const TEST: Network = Network {
    name: "ct",
    subnet: "10.234.0",
};
/// `cargo xtask eval-scale`'s.
pub const EVAL: Network = Network {
    name: "es",
    subnet: "10.235.0",
};

impl Network {
    /// Namespace `hapi-<name>-<node>`.
    pub fn namespace(&self, node: &str) -> String {
        format!("hapi-{}-{node}", self.name)
    }

    /// The compute node's namespace.
    pub fn compute(&self) -> String {
        self.namespace("compute")
    }

    fn bridge(&self) -> String {
        self.namespace("br")
    }

    /// The root-side veth of a node (at most 15 bytes: `h<name>-<node>`).
    fn veth(&self, node: &str) -> String {
        format!("h{}-{node}", self.name)
    }
}
/// The S3 gateway's credentials: the operator's (every action).
pub const S3_KEY: &str = "hapi-cluster";
pub const S3_SECRET: &str = "hapi-cluster-secret";
/// The hosts' (read and list, every bucket: a host serves every tenant its policy grants).
pub const HOST_S3_KEY: &str = "hapi-cluster-host";
pub const HOST_S3_SECRET: &str = "hapi-cluster-host-secret";
/// The tenant's, for its trainer (read and list of [`TENANT_BUCKET`] only).
pub const TENANT_S3_KEY: &str = "hapi-cluster-tenant";
pub const TENANT_S3_SECRET: &str = "hapi-cluster-tenant-secret";
pub const TENANT_BUCKET: &str = "datasets";
/// The one port of the metadata node anyone may reach: the S3 gateway's. Its gRPC port (18333)
/// reloads the gateway's identities without credentials; the master, the filer, and the
/// gateway's Iceberg and Lance catalogs (8181, 9101, on by default) answer anyone too.
const META_OPEN: u16 = 8333;
pub const HOST_PORT: u16 = 8180;
/// At most this many storage nodes (addresses .11 to .(10 + MAX_NODES)).
pub const MAX_NODES: usize = 32;

/// What to start.
#[derive(Debug)]
pub struct Config {
    pub network: Network,
    pub nodes: usize,
    /// Each storage node's link, shaped both ways; `None`: unshaped.
    pub link_mbit: Option<u32>,
    /// The compute node's link, likewise.
    pub compute_link_mbit: Option<u32>,
    /// Logs, SeaweedFS data, host state and policies go here (emptied first).
    pub dir: PathBuf,
    pub weed: PathBuf,
    pub host_binary: PathBuf,
    /// Environment for every `hapi-host` (libtorch's location, thread counts).
    pub host_env: Vec<(String, String)>,
    /// Lines for each host policy's `[host]` table beyond listen, store and state (models,
    /// device, tokens).
    pub host_extra: String,
    /// The policies' tenant tables.
    pub tenants: String,
    /// Each host reads the replicas its node's volume server holds from it, not through the S3
    /// gateway (`host.s3.local_volume_server`), and answers `/v1/placement`.
    pub locality: bool,
}

/// A storage node.
#[derive(Debug)]
pub struct Node {
    pub namespace: String,
    pub addr: String,
    /// `http://addr:HOST_PORT`.
    pub host_url: String,
    pub host: Option<Child>,
    pub volume: Option<Child>,
}

/// A started cluster. Dropping it stops every process and removes the namespaces, unless
/// [`Cluster::detach`] was called (then `cargo xtask cluster down`, [`down`], removes it).
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub meta_addr: String,
    pub compute_addr: String,
    pub dir: PathBuf,
    pub network: Network,
    others: Vec<Child>,
    link_mbit: Option<u32>,
    detached: bool,
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not start `{}`: {e}", describe(cmd)))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(args))
}

/// `program` run inside namespace `ns`.
pub fn in_namespace(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Why a cluster cannot be started here, if it cannot: not root, or no `ip`/`tc`.
pub fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output();
    let root = uid.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("network namespaces need root".into());
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("iptables", "iptables"),
    ] {
        let ok = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Some(format!(
                "`{tool}` ({package}) is not installed (`cargo xtask setup` installs it)"
            ));
        }
    }
    // Root without the capability (a container), or a kernel without bridges or veth pairs:
    // what a cluster makes, made once and removed.
    let id = std::process::id() % 100_000;
    let (ns, bridge, veth) = (
        format!("hapi-probe-{id}"),
        format!("hpb{id}"),
        format!("hpv{id}"),
    );
    let made = ip(&["netns", "add", &ns])
        .and_then(|()| ip(&["link", "add", &bridge, "type", "bridge"]))
        .and_then(|()| {
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])
        })
        .and_then(|()| {
            // A firewall rule in it, as `fence` adds.
            let rule = ["-A", "INPUT", "-p", "tcp", "--dport", "1", "-j", "REJECT"];
            run(in_namespace(&ns, "iptables").args(rule))
                .or_else(|_| run(in_namespace(&ns, "iptables-legacy").args(rule)))
        });
    for args in [
        ["link", "del", &veth],
        ["link", "del", &bridge],
        ["netns", "del", &ns],
    ] {
        let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
    }
    made.err().map(|e| {
        format!(
            "network namespaces, bridges, veth pairs and firewall rules cannot be made here: {e}"
        )
    })
}

/// The namespaces of network `net`, left by an earlier run or not.
fn namespaces(net: Network) -> Vec<String> {
    let prefix = net.namespace("");
    let out = Command::new("ip").args(["netns", "list"]).output();
    let text = out.map_or_else(
        |_| String::new(),
        |o| String::from_utf8_lossy(&o.stdout).into_owned(),
    );
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Stops every process inside the cluster's namespaces and removes them and the bridge.
/// Returns how many namespaces there were.
pub fn down(net: Network) -> usize {
    let spaces = namespaces(net);
    for ns in &spaces {
        let pids = Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
    // Wait for them to go before the namespaces do (a process keeps its namespace alive).
    std::thread::sleep(Duration::from_millis(200));
    for ns in &spaces {
        let _ = ip(&["netns", "del", ns]);
    }
    let _ = Command::new("ip")
        .args(["link", "del", &net.bridge()])
        .stderr(Stdio::null())
        .status();
    // The kernel takes a namespace down in the background (longer with firewall rules in it),
    // and a node's veth end stays until it has: a cluster started at once on the same names
    // found them taken.
    let prefix = net.veth("");
    let _ = wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let links = Command::new("ip").args(["-br", "link"]).output();
        links
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.starts_with(&prefix))
            })
            .then(|| format!("links {prefix}* still there"))
    });
    spaces.len()
}

/// Node `short`'s namespace, with address `<subnet>.last` on the bridge; returns its name.
fn attach(net: Network, short: &str, last: usize) -> Result<String, String> {
    let ns = net.namespace(short);
    let ns = ns.as_str();
    ip(&["netns", "add", ns])?;
    let outside = net.veth(short);
    ip(&[
        "link", "add", &outside, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    ip(&["link", "set", &outside, "master", &net.bridge()])?;
    ip(&["link", "set", &outside, "up"])?;
    let addr = format!("{}.{last}/24", net.subnet);
    for args in [
        vec!["addr", "add", addr.as_str(), "dev", "eth0"],
        vec!["link", "set", "eth0", "up"],
        vec!["link", "set", "lo", "up"],
    ] {
        run(in_namespace(ns, "ip").args(args))?;
    }
    Ok(ns.to_string())
}

/// Node `short`'s firewall: TCP to any port but `open` only from the bridge's address (`.1`),
/// the metadata node (`.2`), the storage nodes' addresses and the node itself; the rest is
/// reset. (The fenced nodes open no connection to anyone else, so no reply needs letting in.)
fn fence(net: Network, short: &str, open: u16) -> Result<(), String> {
    let ns = net.namespace(short);
    let storage = format!("{0}.11-{0}.{1}", net.subnet, 10 + MAX_NODES);
    let (root, meta) = (format!("{}.1", net.subnet), format!("{}.2", net.subnet));
    let open = open.to_string();
    let rules: [Vec<&str>; 6] = [
        vec!["-i", "lo", "-j", "ACCEPT"],
        vec!["-p", "tcp", "--dport", &open, "-j", "ACCEPT"],
        vec!["-s", &root, "-j", "ACCEPT"],
        vec!["-s", &meta, "-j", "ACCEPT"],
        vec!["-m", "iprange", "--src-range", &storage, "-j", "ACCEPT"],
        vec!["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
    ];
    // `iptables` is the nf_tables one on Debian; a kernel without nf_tables has x_tables.
    let mut tool = "iptables";
    for (i, rule) in rules.iter().enumerate() {
        let added = run(in_namespace(&ns, tool).args(["-A", "INPUT"]).args(rule));
        match added {
            Err(_) if i == 0 && tool == "iptables" => {
                tool = "iptables-legacy";
                run(in_namespace(&ns, tool).args(["-A", "INPUT"]).args(rule))?;
            }
            other => other?,
        }
    }
    Ok(())
}

/// Token-bucket shaping at `mbit` on both ends of a node's link; `None` removes it.
fn shape(net: Network, short: &str, mbit: Option<u32>) -> Result<(), String> {
    let (ns, outside) = (net.namespace(short), net.veth(short));
    let ns = ns.as_str();
    for (mut tc, dev) in [
        (Command::new("tc"), outside.as_str()),
        (in_namespace(ns, "tc"), "eth0"),
    ] {
        match mbit {
            Some(mbit) => {
                // Burst: at least 10 ms of traffic at the rate and several MTUs.
                let burst = (u64::from(mbit) * 1_000_000 / 8 / 100).max(32 * 1514);
                tc.args(["qdisc", "replace", "dev", dev, "root", "tbf", "rate"])
                    .arg(format!("{mbit}mbit"))
                    .args(["burst", &burst.to_string(), "latency", "100ms"]);
                run(&mut tc)?;
            }
            None => {
                tc.args(["qdisc", "del", "dev", dev, "root"])
                    .stderr(Stdio::null());
                let _ = tc.status();
            }
        }
    }
    Ok(())
}

/// Writes `bucket/key` through the SeaweedFS filer at `filer` (`addr:port`; a bucket is a
/// directory under /buckets), retried for up to 60 s while the volume servers register.
pub fn filer_put(filer: &str, bucket: &str, key: &str, bytes: &[u8]) -> Result<(), String> {
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || match http(
            filer,
            "PUT",
            &format!("/buckets/{bucket}/{key}"),
            None,
            bytes,
        ) {
            Ok(r) if r.starts_with("HTTP/1.1 2") => None,
            other => Some(format!(
                "PUT {bucket}/{key} through the filer at {filer}: {other:?}"
            )),
        },
    )
}

/// One HTTP/1.1 request to `addr` (`host:port`) on a fresh connection, with bearer `token` if
/// given: the whole response, head and body (10 s read timeout).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    Ok(resp)
}

/// Polls `not_yet` every `every` until it says nothing (ready); past `within`, its last
/// answer is the error.
fn wait_until(
    within: Duration,
    every: Duration,
    mut not_yet: impl FnMut() -> Option<String>,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match not_yet() {
            None => return Ok(()),
            Some(why) if Instant::now() > deadline => return Err(why),
            Some(_) => std::thread::sleep(every),
        }
    }
}

/// Waits until something listens at `addr:port`.
fn wait_port(addr: &str, port: u16, what: &str, log: &Path) -> Result<(), String> {
    let target = format!("{addr}:{port}");
    let sock: std::net::SocketAddr = target.parse().map_err(|e| format!("{target}: {e}"))?;
    wait_until(Duration::from_secs(90), Duration::from_millis(200), || {
        std::net::TcpStream::connect_timeout(&sock, Duration::from_millis(500))
            .is_err()
            .then(|| {
                format!(
                    "{what} did not come up at {target} within 90 s (log: {})",
                    log.display()
                )
            })
    })
}

fn spawn(mut cmd: Command, log: &Path) -> Result<Child, String> {
    use std::os::unix::process::CommandExt;
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        // Its own process group: a Ctrl-C after `cluster up` returns does not reach it.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start `{}`: {e}", describe(&cmd)))
}

impl Cluster {
    /// Starts the cluster `config` describes (an earlier one is taken down first).
    pub fn start(config: &Config) -> Result<Self, String> {
        if let Some(why) = unavailable() {
            return Err(format!("a cluster cannot start here: {why}"));
        }
        if config.nodes == 0 || config.nodes > MAX_NODES {
            return Err(format!("--nodes {}: from 1 to {MAX_NODES}", config.nodes));
        }
        if !config.weed.exists() {
            return Err(format!(
                "{} is missing (run `cargo xtask setup`)",
                config.weed.display()
            ));
        }
        let net = config.network;
        down(net);
        let dir = &config.dir;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir.join("logs")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cluster = Self {
            nodes: Vec::new(),
            meta_addr: format!("{}.2", net.subnet),
            compute_addr: format!("{}.3", net.subnet),
            dir: dir.clone(),
            network: net,
            others: Vec::new(),
            link_mbit: config.link_mbit,
            detached: false,
        };
        // From here a failure drops `cluster`, which removes what was made.
        let bridge = net.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", net.subnet),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        attach(net, "meta", 2)?;
        fence(net, "meta", META_OPEN)?;
        attach(net, "compute", 3)?;
        shape(net, "compute", config.compute_link_mbit)?;
        for i in 1..=config.nodes {
            let ns = attach(net, &format!("n{i}"), 10 + i)?;
            fence(net, &format!("n{i}"), HOST_PORT)?;
            shape(net, &format!("n{i}"), config.link_mbit)?;
            let addr = format!("{}.{}", net.subnet, 10 + i);
            cluster.nodes.push(Node {
                namespace: ns,
                host_url: format!("http://{addr}:{HOST_PORT}"),
                addr,
                host: None,
                volume: None,
            });
        }
        cluster.start_weed(config)?;
        for i in 0..cluster.nodes.len() {
            cluster.start_host(config, i)?;
        }
        Ok(cluster)
    }

    fn start_weed(&mut self, config: &Config) -> Result<(), String> {
        let meta = self.meta_addr.clone();
        let logs = self.dir.join("logs");
        let mdir = self.dir.join("meta");
        std::fs::create_dir_all(mdir.join("master")).map_err(|e| e.to_string())?;
        let replication = if config.nodes >= 2 { "001" } else { "000" };
        let meta_ns = self.network.namespace("meta");
        let mut master = in_namespace(&meta_ns, &config.weed);
        master
            .arg("master")
            .args([
                &format!("-ip={meta}"),
                &format!("-ip.bind={meta}"),
                "-port=9333",
            ])
            .arg(format!("-mdir={}", mdir.join("master").display()))
            .arg(format!("-defaultReplication={replication}"))
            .args(["-volumeSizeLimitMB=64", "-telemetry=false"]);
        let log = logs.join("master.log");
        self.others.push(spawn(master, &log)?);
        wait_port(&meta, 9333, "the SeaweedFS master", &log)?;
        for i in 0..self.nodes.len() {
            self.start_volume(config, i)?;
        }
        // The first write grows the volumes on the servers the master knows then: one that
        // has not sent its first heartbeat would hold none of the data (at 3 nodes, photos
        // landed on nodes 1 and 2 only, and node 3 read all its keys through the gateway).
        self.wait_registered()?;
        let config_path = mdir.join("s3.json");
        std::fs::write(
            &config_path,
            format!(
                r#"{{"identities":[{{"name":"hapi","credentials":[{{"accessKey":"{S3_KEY}","secretKey":"{S3_SECRET}"}}],"actions":["Admin","Read","List","Write"]}},{{"name":"hosts","credentials":[{{"accessKey":"{HOST_S3_KEY}","secretKey":"{HOST_S3_SECRET}"}}],"actions":["Read","List"]}},{{"name":"tenant","credentials":[{{"accessKey":"{TENANT_S3_KEY}","secretKey":"{TENANT_S3_SECRET}"}}],"actions":["Read:{TENANT_BUCKET}","List:{TENANT_BUCKET}"]}}]}}"#
            ),
        )
        .map_err(|e| e.to_string())?;
        let mut filer = in_namespace(&meta_ns, &config.weed);
        filer
            .arg("filer")
            .args([
                &format!("-ip={meta}"),
                &format!("-ip.bind={meta}"),
                "-port=8888",
            ])
            .args([&format!("-master={meta}:9333"), "-s3", "-s3.port=8333"])
            .arg(format!("-s3.config={}", config_path.display()))
            .current_dir(&mdir);
        let log = logs.join("filer.log");
        self.others.push(spawn(filer, &log)?);
        wait_port(&meta, 8888, "the SeaweedFS filer", &log)?;
        wait_port(&meta, 8333, "the SeaweedFS S3 gateway", &log)?;
        Ok(())
    }

    /// Waits until the SeaweedFS master lists every storage node's volume server.
    fn wait_registered(&self) -> Result<(), String> {
        let master = format!("{}:9333", self.meta_addr);
        wait_until(Duration::from_secs(60), Duration::from_millis(200), || {
            let status = http(&master, "GET", "/dir/status", None, b"").unwrap_or_default();
            let missing: Vec<&str> = self
                .nodes
                .iter()
                .filter(|n| !status.contains(&format!("\"{}:8080\"", n.addr)))
                .map(|n| n.addr.as_str())
                .collect();
            (!missing.is_empty()).then(|| {
                format!(
                    "the SeaweedFS master did not list the volume servers of {} within 60 s (logs: {})",
                    missing.join(", "),
                    self.dir.join("logs").display()
                )
            })
        })
    }

    /// Starts storage node `i`'s volume server (again, after [`Cluster::kill_volume`]).
    pub fn start_volume(&mut self, config: &Config, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let data = self.dir.join(format!("n{}/volume", i + 1));
        std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        let mut volume = in_namespace(&node.namespace, &config.weed);
        volume
            .arg("volume")
            .args([
                &format!("-ip={}", node.addr),
                &format!("-ip.bind={}", node.addr),
            ])
            .args([
                "-port=8080",
                &format!("-mserver={}:9333", self.meta_addr),
                "-max=32",
            ])
            .arg(format!("-dir={}", data.display()));
        let log = self.dir.join(format!("logs/volume-n{}.log", i + 1));
        node.volume = Some(spawn(volume, &log)?);
        wait_port(&node.addr, 8080, "a SeaweedFS volume server", &log)
    }

    /// Writes storage node `i`'s policy and starts its host (again, after [`Cluster::kill_host`]).
    pub fn start_host(&mut self, config: &Config, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let nodedir = self.dir.join(format!("n{}", i + 1));
        std::fs::create_dir_all(&nodedir).map_err(|e| e.to_string())?;
        let policy = format!(
            "# Generated for storage node {n} of a `cargo xtask cluster`.\n[host]\nlisten = \"{addr}:{HOST_PORT}\"\nstore = \"s3://\"\nstate = \"{state}\"\n{extra}\n[host.s3]\nendpoint = \"http://{meta}:8333\"\naccess_key_id = \"{HOST_S3_KEY}\"\nsecret_access_key = \"{HOST_S3_SECRET}\"\n{near}\n{tenants}",
            n = i + 1,
            addr = node.addr,
            state = nodedir.join("state").display(),
            extra = config.host_extra.trim_end(),
            meta = self.meta_addr,
            tenants = config.tenants,
            near = if config.locality {
                format!(
                    "seaweedfs_filer = \"http://{}:8888\"\nlocal_volume_server = \"http://{}:8080\"\n",
                    self.meta_addr, node.addr
                )
            } else {
                String::new()
            },
        );
        let path = nodedir.join("policy.toml");
        std::fs::write(&path, policy).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut host = in_namespace(&node.namespace, &config.host_binary);
        host.args(["serve", "--policy"]).arg(&path);
        for (k, v) in &config.host_env {
            host.env(k, v);
        }
        let log = self.dir.join(format!("logs/host-n{}.log", i + 1));
        node.host = Some(spawn(host, &log)?);
        wait_port(&node.addr, HOST_PORT, "hapi-host", &log)?;
        // The port is bound before the host has measured its models' memory (tens of seconds
        // on a loaded CPU, several hosts at once): a job started then would share the CPU
        // with it, and find the hosts silent.
        let addr = format!("{}:{HOST_PORT}", node.addr);
        wait_until(Duration::from_secs(600), Duration::from_millis(500), || {
            let ready = http(&addr, "GET", "/healthz", None, b"")
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200"));
            (!ready).then(|| {
                format!(
                    "hapi-host at {addr} did not answer /healthz within 600 s (log: {})",
                    log.display()
                )
            })
        })
    }

    /// `kill -9` of storage node `i`'s host.
    pub fn kill_host(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].host.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `kill -9` of storage node `i`'s volume server.
    pub fn kill_volume(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].volume.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Shapes every storage node's link to `mbit` (`None`: unshaped).
    pub fn shape_storage(&mut self, mbit: Option<u32>) -> Result<(), String> {
        for i in 1..=self.nodes.len() {
            shape(self.network, &format!("n{i}"), mbit)?;
        }
        self.link_mbit = mbit;
        Ok(())
    }

    /// Bytes through storage node `i`'s link so far: (into the node, out of it).
    pub fn link_bytes(&self, i: usize) -> Result<(u64, u64), String> {
        let dev = self.network.veth(&format!("n{}", i + 1));
        let read = |what: &str| -> Result<u64, String> {
            let path = format!("/sys/class/net/{dev}/statistics/{what}");
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
            text.trim().parse().map_err(|e| format!("{path}: {e}"))
        };
        // The root-side end: what it sends goes into the node.
        Ok((read("tx_bytes")?, read("rx_bytes")?))
    }

    /// Cuts storage node `i` off the network: its end of the bridge goes down, so every packet
    /// to or from it is dropped without an answer (as a failed switch port or cable); its
    /// processes run on and its own interface stays up. (tc's netem, `loss 100%`, is not in
    /// every kernel; this is.) [`Cluster::restore`] undoes it.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&[
            "link",
            "set",
            &self.network.veth(&format!("n{}", i + 1)),
            "down",
        ])
    }

    /// Undoes [`Cluster::cut`]: the node's end of the bridge up again, shaped as configured.
    pub fn restore(&self, i: usize) -> Result<(), String> {
        let short = format!("n{}", i + 1);
        ip(&["link", "set", &self.network.veth(&short), "up"])?;
        shape(self.network, &short, self.link_mbit)
    }

    /// Creates bucket `name` through the filer (a bucket is a directory under /buckets),
    /// retried while the volume servers register.
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        self.put(name, ".bucket", b"")
    }

    /// Writes an object through the filer (unauthenticated, on the metadata node), retried
    /// while the volume servers register.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> Result<(), String> {
        filer_put(&format!("{}:8888", self.meta_addr), bucket, key, bytes)
    }

    /// The S3 endpoint, for `AWS_ENDPOINT`.
    pub fn s3_endpoint(&self) -> String {
        format!("http://{}:8333", self.meta_addr)
    }

    /// The environment the operator's clients of the cluster's S3 gateway need (object_store's
    /// AWS_*): loading data.
    pub fn s3_env(&self) -> Vec<(&'static str, String)> {
        self.s3_env_as(S3_KEY, S3_SECRET)
    }

    /// The tenant's: reading and listing bucket [`TENANT_BUCKET`], for its trainer.
    pub fn tenant_s3_env(&self) -> Vec<(&'static str, String)> {
        self.s3_env_as(TENANT_S3_KEY, TENANT_S3_SECRET)
    }

    fn s3_env_as(&self, key: &str, secret: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.s3_endpoint()),
            ("AWS_ACCESS_KEY_ID", key.into()),
            ("AWS_SECRET_ACCESS_KEY", secret.into()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Leaves everything running when this value is dropped.
    pub fn detach(mut self) {
        self.detached = true;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        for node in &mut self.nodes {
            for child in [node.host.as_mut(), node.volume.as_mut()]
                .into_iter()
                .flatten()
            {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for child in &mut self.others {
            let _ = child.kill();
            let _ = child.wait();
        }
        down(self.network);
    }
}
