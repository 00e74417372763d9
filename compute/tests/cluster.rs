//! A storage tier of three nodes (hapi_tests::cluster: network namespaces on a bridge, a
//! SeaweedFS volume server and a `hapi-host` on each, objects replicated on two nodes, the
//! trainer on a compute node of its own), and the job across it surviving three failures
//! mid-epoch: a host killed, a volume server killed, a node cut off and restored.

mod common;

use common::{
    OPERATOR, fashion_objects, host_binary, http_get_as, invocations, losses, max_diff, stall,
    trainer_tenant,
};
use hapi_tests::cluster::{self, Cluster, Config, TEST};
use hapi_tests::workspace;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "cluster-token";
const TRAIN: usize = 256;
const TEST_SAMPLES: usize = 16;

fn config(dir: &Path) -> Config {
    let weed = std::env::var_os("HAPI_WEED").map_or_else(
        || workspace().join(".hapi/venv-torch-2.13.0/bin/weed"),
        Into::into,
    );
    Config {
        network: TEST,
        nodes: 3,
        link_mbit: Some(200),
        compute_link_mbit: Some(200),
        dir: dir.to_path_buf(),
        weed,
        host_binary: host_binary().to_path_buf(),
        // Three hosts and the trainer share this machine's cores.
        host_env: vec![("OMP_NUM_THREADS".into(), "1".into())],
        host_extra: format!(
            "models = \"{}\"\ndevice = \"cpu\"\noperator_token_sha256 = \"{}\"\n# Batches of one call alone: runs compared loss for loss see the same batches.\npool = false\n",
            hapi_model::models_dir().display(),
            hapi_host::policy::hash_token(OPERATOR),
        ),
        tenants: trainer_tenant(TOKEN),
        locality: true,
    }
}

/// Fashion-MNIST objects into the cluster's `datasets` bucket, through its filer; the keys.
fn load(c: &Cluster) -> Vec<String> {
    c.create_bucket("datasets").expect("bucket");
    let objects = fashion_objects(TRAIN, TEST_SAMPLES);
    for (key, png) in &objects {
        c.put("datasets", key, png).expect("put");
    }
    objects.into_iter().map(|(key, _)| key).collect()
}

/// Whether a TCP connection from the compute node (a tenant's machine) to `addr:port` is
/// accepted within 5 s.
fn reaches_from_compute(c: &Cluster, addr: &str, port: u16) -> bool {
    cluster::in_namespace(&c.network.compute(), "timeout")
        .args([
            "5",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{addr}/{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A client of the S3 gateway with the tenant's credentials (its trainer's), on `bucket`.
fn as_tenant(c: &Cluster, bucket: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(c.s3_endpoint())
        .with_bucket_name(bucket)
        .with_access_key_id(cluster::TENANT_S3_KEY)
        .with_secret_access_key(cluster::TENANT_S3_SECRET)
        .with_region("us-east-1")
        .with_allow_http(true)
        .build()
        .expect("an S3 client")
}

/// What a tenant's machine reaches of the cluster: the hosts and the S3 gateway, with
/// credentials that read and list its bucket and do nothing else; not the master, the filer or
/// a volume server, which answer without credentials. Before, the compute node reached all
/// three, and the trainer had the gateway's admin credentials: any object of any bucket could
/// be read, overwritten or deleted, past every grant of the hosts' policies.
fn the_tenants_machine_reaches_the_hosts_and_its_bucket_only(c: &Cluster, keys: &[String]) {
    let (meta, node) = (c.meta_addr.as_str(), c.nodes[0].addr.as_str());
    // Master, filer (HTTP, gRPC), the gateway's gRPC (which reloads its identities without
    // credentials), a volume server (HTTP, gRPC).
    for (addr, port) in [
        (meta, 9333),
        (meta, 19333),
        (meta, 8888),
        (meta, 18888),
        (meta, 18333),
        (node, 8080),
        (node, 18080),
    ] {
        assert!(
            !reaches_from_compute(c, addr, port),
            "{addr}:{port} answers the compute node"
        );
    }
    for (addr, port) in [(meta, 8333), (node, cluster::HOST_PORT)] {
        assert!(
            reaches_from_compute(c, addr, port),
            "{addr}:{port} does not answer the compute node"
        );
    }
    c.create_bucket("private").expect("bucket");
    c.put("private", "weights.bin", b"another tenant's")
        .expect("put");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        use object_store::path::Path as Key;
        use object_store::{ObjectStoreExt, PutPayload};
        let mine = as_tenant(c, cluster::TENANT_BUCKET);
        let key = Key::from(keys[0].as_str());
        mine.get(&key).await.expect("the tenant reads its bucket");
        let planted = mine
            .put(
                &Key::from("fashion-mnist/planted.png"),
                PutPayload::from_static(b"x"),
            )
            .await;
        assert!(planted.is_err(), "the tenant wrote: {planted:?}");
        let deleted = mine.delete(&key).await;
        assert!(deleted.is_err(), "the tenant deleted: {deleted:?}");
        mine.get(&key).await.expect("still there");
        let other = as_tenant(c, "private")
            .get(&Key::from("weights.bin"))
            .await
            .map(|_| ());
        assert!(other.is_err(), "the tenant read another bucket: {other:?}");
    });
}

/// The trainer on the compute node, against every host, reading the listing through S3.
fn trainer(c: &Cluster, out: &Path) -> Child {
    let mut cmd = cluster::in_namespace(
        &c.network.compute(),
        hapi_tests::package_binary("hapi-train", env!("CARGO_BIN_EXE_hapi-train")),
    );
    for n in &c.nodes {
        cmd.args(["--host", &n.host_url]);
    }
    cmd.args(["--token", TOKEN, "--store", "s3://", "--bucket", "datasets"])
        .args(["--prefix", "fashion-mnist", "--model", "efficientnet_lite0"])
        .args([
            "--batch",
            "16",
            "--seed",
            "7",
            "--quiet",
            "--request-size",
            "4",
        ])
        .args([
            "--in-flight",
            "2",
            "--device",
            "cpu",
            "--split",
            "13",
            "--prefetch",
            "1",
        ])
        .args(["--no-test", "--epochs", "1", "--locality", "--out"])
        .arg(out)
        .envs(c.tenant_s3_env())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hapi-train starts")
}

/// Waits for `child`, which must succeed; returns its results and its stderr.
fn finish(child: Child, out: &Path, what: &str) -> (Value, String) {
    let o = child.wait_with_output().expect("trainer finishes");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{what}: hapi-train failed:\n{stderr}");
    let results = serde_json::from_slice(&std::fs::read(out).expect("results")).expect("JSON");
    (results, stderr)
}

/// Waits until the cluster's hosts have answered `n` more invocations than `base`.
fn after_invocations(c: &Cluster, base: u64, n: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while total_invocations(c) < base + n {
        assert!(Instant::now() < deadline, "{what}: the job never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads the hosts served from their local volume servers, and through the S3 gateway.
fn reads(c: &Cluster) -> (u64, u64) {
    let (mut local, mut gateway) = (0, 0);
    for n in &c.nodes {
        let text = http_get_as(&n.host_url, "/metrics", OPERATOR).expect("metrics");
        let counted = |from: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("hapi_locality_reads_total{{from=\"{from}\"}} "))
                })
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no hapi_locality_reads_total from {from}:\n{text}"))
        };
        local += counted("local");
        gateway += counted("gateway");
    }
    (local, gateway)
}

fn total_invocations(c: &Cluster) -> u64 {
    c.nodes.iter().map(|n| invocations(&n.host_url)).sum()
}

fn counter(r: &Value, field: &str) -> u64 {
    r["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| e[field].as_u64().expect(field))
        .sum()
}

/// Starts a 3-node cluster in namespaces (skipped, saying why, without root, iproute2 or
/// iptables), each host reading replicas from its own volume server and the trainer sending
/// each key to a host beside a replica (`--locality`); checks what the compute node reaches
/// (`the_tenants_machine_reaches_the_hosts_and_its_bucket_only`); runs a short job across it undisturbed (at least half the
/// objects read locally), then the same job three times with a failure a few iterations in: node 2's host
/// `kill -9`ed (the trainer retries its requests elsewhere and ejects it), node 3's volume
/// server `kill -9`ed (its host reads through the S3 gateway, which reads the replica on
/// another node), the node whose host served most cut off the network for 4 s and restored
/// (its requests hang: the trainer hedges them). Every run's losses equal the undisturbed
/// run's; each run's stall (its longest interval between iterations against the median) is
/// printed.
#[test]
fn a_job_across_a_three_node_cluster_survives_a_host_a_volume_server_and_a_node_lost_mid_epoch() {
    if let Some(why) = cluster::unavailable() {
        println!("skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let mut c = Cluster::start(&config).expect("the cluster starts");
    let keys = load(&c);
    the_tenants_machine_reaches_the_hosts_and_its_bucket_only(&c, &keys);
    let run = |c: &Cluster, name: &str| -> (Child, std::path::PathBuf) {
        let out = dir.path().join(format!("{name}.json"));
        (trainer(c, &out), out)
    };
    let (child, out) = run(&c, "calm");
    let (calm, stderr) = finish(child, &out, "calm");
    let base = losses(&calm);
    // Keys went to hosts beside a replica, which read them from their own volume servers; a
    // host's even share of a batch caps that (the data may sit on two of the three nodes: then
    // a third of the keys goes to the third node and through the gateway), so at least half.
    assert!(
        stderr.contains("locality: 3 of 3 hosts"),
        "no locality:\n{stderr}"
    );
    let (local, gateway) = reads(&c);
    assert!(
        local >= TRAIN as u64 / 2 && local + gateway >= TRAIN as u64,
        "{local} reads from local volume servers, {gateway} through the gateway"
    );
    println!(
        "undisturbed: {local} reads from local volume servers, {gateway} through the S3 gateway"
    );
    let (worst, median) = stall(&calm);
    println!("undisturbed: longest interval {worst:.3} s, median {median:.3} s");

    // A host killed.
    let (child, out) = run(&c, "host-killed");
    after_invocations(&c, total_invocations(&c), 12, "host killed");
    c.kill_host(1);
    let (r, stderr) = finish(child, &out, "host killed");
    let d = max_diff(&base, &losses(&r));
    assert!(d <= 1e-6, "host killed: losses differ by {d}");
    let moved = counter(&r, "retries") + counter(&r, "hedges");
    assert!(
        moved > 0,
        "host killed: nothing was retried or hedged:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("host {}", c.nodes[1].host_url)) && stderr.contains("ejected"),
        "host killed: no per-host report:\n{stderr}"
    );
    let (worst, median) = stall(&r);
    println!(
        "host killed: longest interval {worst:.3} s, median {median:.3} s, {moved} requests retried or hedged"
    );
    c.start_host(&config, 1).expect("host 2 restarts");

    // A volume server killed: its objects have a replica on another node.
    let (child, out) = run(&c, "volume-killed");
    after_invocations(&c, total_invocations(&c), 12, "volume server killed");
    c.kill_volume(2);
    let (r, stderr) = finish(child, &out, "volume server killed");
    let d = max_diff(&base, &losses(&r));
    assert!(
        d <= 1e-6,
        "volume server killed: losses differ by {d}:\n{stderr}"
    );
    let (worst, median) = stall(&r);
    let moved = counter(&r, "retries") + counter(&r, "hedges");
    println!(
        "volume server killed: longest interval {worst:.3} s, median {median:.3} s, {moved} requests retried or hedged"
    );
    c.start_volume(&config, 2)
        .expect("volume server 3 restarts");

    // A node cut off and restored.
    // The node cut is the one whose host this run has used most so far: requests keep
    // going to it (its keys' replicas are there) until the trainer routes around it.
    let before: Vec<u64> = c.nodes.iter().map(|n| invocations(&n.host_url)).collect();
    let (child, out) = run(&c, "node-cut");
    after_invocations(&c, before.iter().sum(), 12, "node cut off");
    let cut = (0..c.nodes.len())
        .max_by_key(|&i| invocations(&c.nodes[i].host_url) - before[i])
        .expect("nodes");
    let cut_at = Instant::now();
    c.cut(cut).expect("cut the node off");
    std::thread::sleep(Duration::from_secs(4));
    c.restore(cut).expect("restore the node");
    let (r, stderr) = finish(child, &out, "node cut off");
    println!(
        "node {} cut off {:.1} s before the job ended",
        cut + 1,
        cut_at.elapsed().as_secs_f64()
    );
    let d = max_diff(&base, &losses(&r));
    assert!(d <= 1e-6, "node cut off: losses differ by {d}:\n{stderr}");
    let moved = counter(&r, "retries") + counter(&r, "hedges");
    assert!(
        moved > 0,
        "node cut off: nothing was retried or hedged:\n{stderr}"
    );
    let (worst, median) = stall(&r);
    println!(
        "node cut off for 4 s: longest interval {worst:.3} s, median {median:.3} s, {moved} requests retried or hedged"
    );
    drop(c);
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(&TEST.namespace("")),
        "the cluster's namespaces outlived it"
    );
}
