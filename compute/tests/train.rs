//! `hapi-train` end to end: the real `hapi-host` binary serving the real `feature-extract`
//! component over a socket, real Fashion-MNIST objects in a local store, real libtorch.

mod common;

use common::{
    OPERATOR, fashion_objects, host_binary, invocations, losses, max_diff, stall, trainer_tenant,
};
use hapi_tests::{HostProcess, workspace};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "trainer-token";
const TRAIN: usize = 64;
const TEST: usize = 32;

/// A store with `TRAIN` + `TEST` Fashion-MNIST objects in ImageFolder layout, and a policy.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for (key, png) in fashion_objects(TRAIN, TEST) {
            let path = dir.path().join("store/datasets").join(key);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, png).expect("write");
        }
        let policy = format!(
            r#"
[host]
listen = "127.0.0.1:0"
store = "{store}"
models = "{models}"
state = "{state}"
device = "cpu"
operator_token_sha256 = "{operator}"
# Device batches made from each call alone, not pooled with the job's other calls in flight:
# libtorch's kernels round differently at different batch sizes (last bits of a feature), and
# two jobs compared loss for loss must see the same batches, not those timing made.
pool = false

{tenant}"#,
            store = dir.path().join("store").display(),
            models = hapi_model::models_dir().display(),
            state = dir.path().join("state").display(),
            operator = hapi_host::policy::hash_token(OPERATOR),
            tenant = trainer_tenant(TOKEN),
        );
        std::fs::write(dir.path().join("policy.toml"), policy).expect("policy");
        Self { dir }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// A train object's path and key (the first one in sorted order).
    fn first_train_object(&self) -> (PathBuf, String) {
        let root = self.store().join("datasets");
        let mut files: Vec<PathBuf> = walk(&root.join("fashion-mnist/train"));
        files.sort();
        let path = files.into_iter().next().expect("a train object");
        let key = path
            .strip_prefix(&root)
            .expect("under root")
            .to_string_lossy()
            .into_owned();
        (path, key)
    }

    fn start_host(&self, listen: &str) -> HostProcess {
        HostProcess::serve(host_binary(), &self.dir.path().join("policy.toml"), listen)
    }

    /// Another host on the same store and policy, with a state directory of its own (as a
    /// host on another node would have).
    fn start_second_host(&self, name: &str) -> HostProcess {
        let policy = std::fs::read_to_string(self.dir.path().join("policy.toml")).expect("policy");
        let state = self.dir.path().join("state");
        let other = self.dir.path().join(format!("state-{name}"));
        let policy = policy.replace(
            &format!("state = \"{}\"", state.display()),
            &format!("state = \"{}\"", other.display()),
        );
        assert!(policy.contains(&other.display().to_string()), "state line");
        let path = self.dir.path().join(format!("policy-{name}.toml"));
        std::fs::write(&path, policy).expect("policy");
        HostProcess::serve(host_binary(), &path, "127.0.0.1:0")
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn trainer(fx: &Fixture, url: &str, out: &Path, args: &[&str]) -> Command {
    trainer_as(TOKEN, fx, url, out, args)
}

fn trainer_as(token: &str, fx: &Fixture, url: &str, out: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(hapi_tests::package_binary(
        "hapi-train",
        env!("CARGO_BIN_EXE_hapi-train"),
    ));
    cmd.args(["--host", url, "--token", token, "--store"])
        .arg(fx.store())
        .args([
            "--model",
            "efficientnet_lite0",
            "--batch",
            "16",
            "--seed",
            "7",
            "--quiet",
        ])
        .args([
            "--request-size",
            "4",
            "--in-flight",
            "2",
            "--device",
            "cpu",
            "--out",
        ])
        .arg(out)
        .args(args);
    cmd
}

fn run_ok(cmd: &mut Command) -> Value {
    let out = cmd.output().expect("hapi-train runs");
    assert!(
        out.status.success(),
        "hapi-train failed ({:?}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let path = cmd
        .get_args()
        .skip_while(|a| *a != "--out")
        .nth(1)
        .expect("--out");
    serde_json::from_slice(&std::fs::read(path).expect("results")).expect("results JSON")
}

#[test]
fn the_loss_is_the_same_for_none_a_middle_split_and_freeze_and_auto_plans() {
    let fx = Fixture::new();
    let host = fx.start_host("127.0.0.1:0");
    let tmp = fx.dir.path();
    let mut runs = Vec::new();
    for split in ["none", "13", "freeze"] {
        let out = tmp.join(format!("split-{split}.json"));
        let r = run_ok(&mut trainer(
            &fx,
            &host.url,
            &out,
            &["--split", split, "--epochs", "2"],
        ));
        runs.push((split, r));
    }
    let base = losses(&runs[0].1);
    assert_eq!(base.len(), 2 * TRAIN.div_ceil(16));
    assert!(base.iter().all(|l| l.is_finite() && *l > 0.0), "{base:?}");
    for (split, r) in &runs[1..] {
        let d = max_diff(&base, &losses(r));
        assert!(
            d <= 1e-4,
            "split {split}: step losses differ from none by {d}"
        );
        let e = &r["epochs"][0];
        assert!(e["bytes_received"].as_u64().expect("bytes") > 0);
        assert!(e["test_accuracy"].as_f64().is_some());
    }
    // Pushing every frozen layer down sends [1280] floats per sample; none sends nothing
    // through the host, and split 13 sends more than freeze.
    let bytes = |i: usize| {
        runs[i].1["epochs"][0]["bytes_received"]
            .as_u64()
            .expect("bytes")
    };
    assert!(
        bytes(1) > bytes(2),
        "split 13 {} <= freeze {}",
        bytes(1),
        bytes(2)
    );
    assert_eq!(runs[0].1["epochs"][0]["requests"], TRAIN as u64);
    // auto: a plan with an estimate for every split, and exploration on training iterations
    // among its candidates, with the losses of a fixed split.
    let out = tmp.join("auto.json");
    let trace = tmp.join("auto.trace.jsonl");
    let r = run_ok(
        trainer(
            &fx,
            &host.url,
            &out,
            &["--split", "auto", "--no-test", "--trace"],
        )
        .arg(&trace),
    );
    let plan = &r["plan"];
    assert_eq!(
        plan["estimates"].as_array().expect("estimates").len(),
        1 + 26
    );
    let candidates = plan["candidates"].as_array().expect("candidates");
    assert!(
        !candidates.is_empty() && candidates.len() <= 4,
        "{candidates:?}"
    );
    assert_eq!(plan["chosen"], candidates[0]);
    let epoch = &r["epochs"][0];
    assert!(candidates.contains(&epoch["split"]), "{epoch}");
    assert!(epoch["predicted"]["epoch"].as_f64().expect("predicted") > 0.0);
    // Every iteration is traced, in the results and live in --trace, at a candidate split.
    let steps = TRAIN.div_ceil(16);
    let traced = epoch["trace"].as_array().expect("trace");
    assert_eq!(traced.len(), steps);
    assert!(traced.iter().all(|i| candidates.contains(&i["split"])));
    let lines: Vec<Value> = std::fs::read_to_string(&trace)
        .expect("--trace written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), steps);
    assert_eq!(lines[steps - 1]["iteration"], steps - 1);
    let d = max_diff(&base[..steps], &losses(&r));
    assert!(d <= 1e-4, "auto's losses differ from none by {d}");
    // Exploration forced over three splits as different as they come: each batch at whichever
    // split the chooser gave it, the same losses as none over two epochs.
    let out = tmp.join("auto-forced.json");
    let r = run_ok(&mut trainer(
        &fx,
        &host.url,
        &out,
        &[
            "--split",
            "auto",
            "--candidates",
            "none,13,freeze",
            "--epochs",
            "2",
            "--no-test",
        ],
    ));
    let used: std::collections::BTreeSet<String> = r["epochs"][0]["trace"]
        .as_array()
        .expect("trace")
        .iter()
        .take(3)
        .map(|i| i["split"].to_string())
        .collect();
    // The first batches go one to each candidate before any can be dropped.
    assert_eq!(used.len(), 3, "exploration used {used:?}");
    assert!(r["epochs"][0]["moves"].is_array());
    let d = max_diff(&base, &losses(&r));
    assert!(
        d <= 1e-4,
        "adaptive losses differ from none by {d} (splits {used:?})"
    );
    // A candidate past the freeze index is refused before anything runs.
    let o = trainer(
        &fx,
        &host.url,
        &tmp.join("bad.json"),
        &["--split", "auto", "--candidates", "3,99"],
    )
    .output()
    .expect("hapi-train runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--candidates: split 99 is past the freeze index"),
        "{stderr}"
    );
}

#[test]
fn a_host_that_is_not_running_is_a_clear_error_with_its_own_exit_code() {
    let fx = Fixture::new();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let out = fx.dir.path().join("r.json");
    let o: Output = trainer(&fx, &url, &out, &["--split", "13"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("cannot reach storage host") && stderr.contains(&url),
        "{stderr}"
    );
}

/// A refusal (a wrong token here) is not a failing storage tier: its own exit code, which the
/// systemd unit does not restart, whether the invocation or the profile `auto` asks for first
/// meets it.
#[test]
fn a_refused_job_has_its_own_exit_code() {
    let fx = Fixture::new();
    let host = fx.start_host("127.0.0.1:0");
    for split in ["13", "auto"] {
        let out = fx.dir.path().join(format!("refused-{split}.json"));
        let o = trainer_as("not-the-token", &fx, &host.url, &out, &["--split", split])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(i32::from(hapi_train::exit::REFUSED)),
            "--split {split}: {stderr}"
        );
        assert!(
            stderr.contains("refused the request (401 bad_token)"),
            "--split {split}: {stderr}"
        );
    }
    let unit = std::fs::read_to_string(workspace().join("examples/systemd/hapi-train@.service"))
        .expect("unit");
    let prevented = unit
        .lines()
        .find_map(|l| l.strip_prefix("RestartPreventExitStatus="))
        .expect("RestartPreventExitStatus");
    assert!(
        prevented
            .split_whitespace()
            .any(|c| c == hapi_train::exit::REFUSED.to_string()),
        "the unit restarts refused jobs: {prevented}"
    );
}

#[test]
fn a_host_killed_and_restarted_mid_epoch_is_retried_and_the_result_is_unchanged() {
    let fx = Fixture::new();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let listen = format!("127.0.0.1:{port}");
    let mut host = fx.start_host(&listen);
    let url = host.url.clone();
    let args = ["--split", "13", "--prefetch", "1", "--no-test"];
    let calm = run_ok(&mut trainer(
        &fx,
        &url,
        &fx.dir.path().join("calm.json"),
        &args,
    ));

    let out = fx.dir.path().join("killed.json");
    let child = trainer(&fx, &url, &out, &args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainer");
    // Kill the host once it has answered a few of this run's requests.
    let client = std::net::TcpStream::connect(&listen).map(drop);
    assert!(client.is_ok(), "host listening");
    let base = invocations(&url);
    let deadline = Instant::now() + Duration::from_secs(120);
    while invocations(&url) < base + 3 {
        assert!(Instant::now() < deadline, "the trainer never invoked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = host.child.kill();
    let _ = host.child.wait();
    std::thread::sleep(Duration::from_millis(1500));
    host = fx.start_host(&listen);
    let o = child.wait_with_output().expect("trainer finishes");
    drop(host);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let killed: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("results")).expect("json");
    assert!(
        killed["epochs"][0]["retries"].as_u64().expect("retries") > 0,
        "the trainer never had to retry"
    );
    let d = max_diff(&losses(&calm), &losses(&killed));
    assert!(d <= 1e-6, "losses differ after the restart by {d}");
}

/// Two hosts serve the job; mid-epoch one is killed (`kill -9`), and in another run one is
/// frozen (`SIGSTOP`: it keeps its connections and answers nothing, as a node cut off does).
/// The job goes on with the other host and its losses are those of an undisturbed run: a
/// failed request is retried on the other host at once, a request the frozen host sits on is
/// sent to the other host too (hedged), and the failed host is left out.
#[test]
fn with_two_hosts_one_killed_or_frozen_mid_epoch_the_job_goes_on_with_the_same_losses() {
    let fx = Fixture::new();
    let a = fx.start_host("127.0.0.1:0");
    // Host b comes from a hosts file, host a from --host.
    let run = |b: &HostProcess, name: &str, args: &[&str]| {
        let file = fx.dir.path().join(format!("hosts-{name}"));
        std::fs::write(
            &file,
            format!("# the second storage node\n\n{}  # b\n", b.url),
        )
        .expect("hosts file");
        let file = file.display().to_string();
        let mut all = vec!["--hosts-file", file.as_str()];
        all.extend_from_slice(args);
        trainer(
            &fx,
            &a.url,
            &fx.dir.path().join(format!("{name}.json")),
            &all,
        )
    };
    let args = [
        "--split",
        "13",
        "--prefetch",
        "1",
        "--no-test",
        "--epochs",
        "2",
    ];
    let b = fx.start_second_host("b");
    let calm = run_ok(&mut run(&b, "calm", &args));
    let (worst, median) = stall(&calm);
    println!("undisturbed: longest interval {worst:.3} s, median {median:.3} s");
    for (name, signal) in [("killed", "-KILL"), ("frozen", "-STOP")] {
        let mut b = fx.start_second_host(name);
        let child = run(&b, name, &args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("trainer");
        let deadline = Instant::now() + Duration::from_secs(120);
        while invocations(&b.url) < 3 {
            assert!(Instant::now() < deadline, "{name}: host b never invoked");
            std::thread::sleep(Duration::from_millis(20));
        }
        let st = Command::new("kill")
            .args([signal, &b.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "{name}: kill {signal}");
        let o = child.wait_with_output().expect("trainer finishes");
        let _ = b.child.kill();
        let _ = b.child.wait();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {stderr}");
        let r: Value = serde_json::from_slice(
            &std::fs::read(fx.dir.path().join(format!("{name}.json"))).expect("results"),
        )
        .expect("json");
        let d = max_diff(&losses(&calm), &losses(&r));
        assert!(d <= 1e-6, "{name}: losses differ by {d}");
        let total = |field: &str| -> u64 {
            r["epochs"]
                .as_array()
                .expect("epochs")
                .iter()
                .map(|e| e[field].as_u64().expect(field))
                .sum()
        };
        let retries = total("retries") + total("hedges");
        assert!(
            retries > 0,
            "{name}: nothing was retried or hedged:\n{stderr}"
        );
        if name == "frozen" {
            assert!(
                total("hedges") > 0,
                "frozen: no request was hedged:\n{stderr}"
            );
        }
        assert!(
            stderr.contains(&format!("host {}", b.url)) && stderr.contains("ejected"),
            "{name}: no per-host report:\n{stderr}"
        );
        let (worst, median) = stall(&r);
        println!(
            "{name}: longest interval {worst:.3} s, median {median:.3} s, retried or hedged {retries}"
        );
    }
}

/// A hosts file that cannot be read, or holds a line that is not a URL, is an error that names
/// the file and the line, before anything starts.
#[test]
fn a_bad_hosts_file_is_an_error_naming_the_file_and_line() {
    let fx = Fixture::new();
    let missing = fx.dir.path().join("no-such-hosts");
    let bad = fx.dir.path().join("hosts");
    std::fs::write(&bad, "http://127.0.0.1:1\n# ok\nnode2:8080\n").expect("write");
    for (file, wants) in [(&missing, "no-such-hosts"), (&bad, "line 3: `node2:8080`")] {
        let out = fx.dir.path().join("never.json");
        let o = trainer(&fx, "http://127.0.0.1:1", &out, &["--hosts-file"])
            .arg(file)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", file.display());
        assert!(stderr.contains(wants), "{}: {stderr}", file.display());
    }
}

/// The systemd units of `examples/systemd` (docs/operating.md) pass `systemd-analyze verify`
/// with their binaries pointing at the ones built here: every key known, every command
/// executable. Skipped, saying so, where `systemd-analyze` is not installed.
#[test]
fn the_systemd_units_in_the_examples_verify() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped: systemd-analyze is not installed");
        return;
    };
    assert!(probe.status.success(), "systemd-analyze --version");
    let dir = tempfile::tempdir().expect("tempdir");
    let examples = workspace().join("examples/systemd");
    for (file, as_name) in [
        ("hapi-host.service", "hapi-host.service"),
        ("hapi-train@.service", "hapi-train@job.service"),
    ] {
        let text = std::fs::read_to_string(examples.join(file)).expect("unit");
        let text = text
            .replace(
                "/usr/local/bin/hapi-host",
                &host_binary().display().to_string(),
            )
            .replace(
                "/usr/local/bin/hapi-train",
                &hapi_tests::package_binary("hapi-train", env!("CARGO_BIN_EXE_hapi-train"))
                    .display()
                    .to_string(),
            );
        let path = dir.path().join(as_name);
        std::fs::write(&path, text).expect("write");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "{file}: {:?}\n{stderr}",
            out.status
        );
    }
}

/// Invocations the host has answered (all codes), from /metrics; 0 when it is down.
#[test]
fn a_corrupt_object_is_named_or_skipped_and_counted() {
    let fx = Fixture::new();
    let host = fx.start_host("127.0.0.1:0");
    let (path, key) = fx.first_train_object();
    std::fs::write(&path, b"\x89PNG\r\n\x1a\nthis is not an image").expect("corrupt");
    for split in ["13", "none"] {
        let out = fx.dir.path().join(format!("bad-{split}.json"));
        let o = trainer(&fx, &host.url, &out, &["--split", split, "--no-test"])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(4), "split {split}: {stderr}");
        assert!(
            stderr.contains(&key),
            "split {split}: the error does not name `{key}`: {stderr}"
        );

        let r = run_ok(&mut trainer(
            &fx,
            &host.url,
            &out,
            &["--split", split, "--no-test", "--skip-bad"],
        ));
        assert_eq!(r["skipped_total"], 1, "split {split}");
        assert_eq!(r["epochs"][0]["skipped"][0], key.as_str());
        assert_eq!(r["epochs"][0]["samples"], (TRAIN - 1) as u64);
    }
}

#[test]
fn a_resumed_job_continues_exactly_where_the_checkpoint_left_it() {
    let fx = Fixture::new();
    let host = fx.start_host("127.0.0.1:0");
    let ckpt = fx.dir.path().join("ckpt");
    let ckpt_arg = ckpt.to_string_lossy().into_owned();
    let common = ["--split", "freeze", "--no-test", "--optimizer", "adam"];
    let whole = run_ok(
        trainer(&fx, &host.url, &fx.dir.path().join("whole.json"), &common).args(["--epochs", "2"]),
    );
    let first = run_ok(
        trainer(&fx, &host.url, &fx.dir.path().join("first.json"), &common).args([
            "--epochs",
            "1",
            "--checkpoint",
            &ckpt_arg,
        ]),
    );
    assert!(ckpt.join("epoch-0001/head.safetensors").is_file());
    let resumed = run_ok(
        trainer(&fx, &host.url, &fx.dir.path().join("resumed.json"), &common).args([
            "--epochs",
            "2",
            "--checkpoint",
            &ckpt_arg,
            "--resume",
        ]),
    );
    assert_eq!(resumed["epochs"].as_array().expect("epochs").len(), 2);
    assert_eq!(losses(&first), losses(&whole)[..losses(&first).len()]);
    let d = max_diff(&losses(&whole), &losses(&resumed));
    assert!(d <= 1e-6, "resumed losses differ by {d}");
    // A checkpoint from another job is refused.
    let o = trainer(&fx, &host.url, &fx.dir.path().join("other.json"), &common)
        .args([
            "--epochs",
            "2",
            "--checkpoint",
            &ckpt_arg,
            "--resume",
            "--train-limit",
            "63",
        ])
        .output()
        .expect("runs");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("different job"));
}

/// The shard files of a feature store directory.
fn shards(dir: &Path) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect()
}

#[test]
fn stored_features_serve_later_jobs_with_the_losses_they_would_have_had() {
    let fx = Fixture::new();
    let host = fx.start_host("127.0.0.1:0");
    let tmp = fx.dir.path();
    let store = tmp.join("features");
    let fs = store.to_string_lossy().into_owned();
    let common = ["--split", "freeze", "--epochs", "2"];
    let with_store = |name: &str, lr: &str, url: &str| -> Command {
        let mut cmd = trainer(&fx, url, &tmp.join(name), &common);
        cmd.args(["--lr", lr, "--feature-store", &fs]);
        cmd
    };
    let from_cache = |r: &Value| -> Vec<bool> {
        r["epochs"]
            .as_array()
            .expect("epochs")
            .iter()
            .map(|e| e["from_cache"].as_bool().expect("from_cache"))
            .collect()
    };

    // Job 1 extracts in its first epoch and stores every train and test sample.
    let first = run_ok(&mut with_store("first.json", "0.001", &host.url));
    assert_eq!(from_cache(&first), [false, true]);
    assert!(!shards(&store).is_empty(), "nothing stored");

    // Job 2, another learning rate: not one invocation, not one byte from the storage tier...
    let before = invocations(&host.url);
    let second = run_ok(&mut with_store("second.json", "0.003", &host.url));
    assert_eq!(
        invocations(&host.url),
        before,
        "job 2 invoked the storage tier"
    );
    assert_eq!(from_cache(&second), [true, true]);
    for e in second["epochs"].as_array().expect("epochs") {
        assert_eq!(e["bytes_received"], 0);
    }
    // ...and the losses and accuracy the same job has without the store.
    let plain =
        run_ok(trainer(&fx, &host.url, &tmp.join("plain.json"), &common).args(["--lr", "0.003"]));
    let d = max_diff(&losses(&plain), &losses(&second));
    assert!(
        d <= 1e-6,
        "losses differ from the job without the store by {d}"
    );
    assert_eq!(
        plain["epochs"][1]["test_accuracy"],
        second["epochs"][1]["test_accuracy"]
    );

    // Every sample stored: no storage host is needed, not even to choose a split.
    let down = run_ok(
        trainer(&fx, "http://127.0.0.1:9", &tmp.join("down.json"), &[]).args([
            "--split",
            "auto",
            "--epochs",
            "1",
            "--lr",
            "0.003",
            "--feature-store",
            &fs,
        ]),
    );
    assert!(down["plan"].is_null(), "a plan with every sample stored");
    let d = max_diff(&losses(&down), &losses(&second)[..TRAIN.div_ceil(16)]);
    assert!(d <= 1e-6, "{d}");

    // An object rewritten since has another version: the job extracts again and stores it anew.
    let (path, key) = fx.first_train_object();
    let mut others = walk(&fx.store().join("datasets/fashion-mnist/test"));
    others.sort();
    std::fs::copy(&others[0], &path).expect("rewrite an object");
    let changed = run_ok(&mut with_store("changed.json", "0.003", &host.url));
    assert_eq!(from_cache(&changed), [false, true], "`{key}` changed");
    assert!(
        max_diff(&losses(&changed), &losses(&second)) > 0.0,
        "the new image changed nothing"
    );
    let again = run_ok(&mut with_store("again.json", "0.003", &host.url));
    assert_eq!(from_cache(&again), [true, true]);
    let d = max_diff(&losses(&again), &losses(&changed));
    assert!(d <= 1e-6, "{d}");

    // Damaged shards are named, and what they held is extracted again with the same result.
    for s in shards(&store) {
        std::fs::write(&s, b"not a safetensors file").expect("damage");
    }
    let out = tmp.join("damaged.json");
    let o = with_store("damaged.json", "0.003", &host.url)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("shard-") && stderr.contains("will be extracted again"),
        "{stderr}"
    );
    let damaged: Value =
        serde_json::from_slice(&std::fs::read(out).expect("results")).expect("json");
    assert_eq!(from_cache(&damaged), [false, true]);
    let d = max_diff(&losses(&damaged), &losses(&changed));
    assert!(d <= 1e-6, "{d}");
}

#[test]
fn narrow_types_on_the_wire_cut_the_bytes_and_train_alike() {
    let fx = Fixture::new();
    let host = fx.start_host("127.0.0.1:0");
    let run = |dtype: &str| {
        run_ok(
            trainer(
                &fx,
                &host.url,
                &fx.dir.path().join(format!("{dtype}.json")),
                &[],
            )
            .args(["--split", "freeze", "--no-test", "--wire-dtype", dtype]),
        )
    };
    let wide = run("f32");
    let bytes = |r: &Value| r["epochs"][0]["bytes_received"].as_u64().expect("bytes");
    let mut narrowed = Vec::new();
    for (dtype, share, most) in [
        ("f16", 0.45..=0.52, 0.05),
        ("bf16", 0.45..=0.52, 0.05),
        // A byte per value and a scale per sample (Lite0's pooled features).
        ("int8", 0.24..=0.30, 0.1),
    ] {
        let narrow = run(dtype);
        let ratio = bytes(&narrow) as f64 / bytes(&wide) as f64;
        println!(
            "{dtype}: {} bytes against {} ({ratio:.3})",
            bytes(&narrow),
            bytes(&wide)
        );
        assert!(
            share.contains(&ratio),
            "{dtype}: {} bytes against {} ({ratio:.3})",
            bytes(&narrow),
            bytes(&wide)
        );
        // Rounded features train the same head to nearly the same losses, not the same ones.
        let d = max_diff(&losses(&wide), &losses(&narrow));
        println!("{dtype}: losses differ from f32 by at most {d}");
        assert!(
            d > 0.0 && d < most,
            "{dtype}: losses differ from f32 by {d}"
        );
        narrowed.push((dtype, narrow));
    }
    // auto: chosen from the features' values, recorded with its reason, and then exactly the
    // run of the dtype it chose (EfficientNet-Lite0's features at the freeze index are small).
    let auto = run("auto");
    let config = &auto["config"];
    let chosen = config["wire_dtype"].as_str().expect("wire_dtype");
    let reason = config["wire_dtype_reason"].as_str().expect("a reason");
    assert!(
        config["wire_dtype_auto"].as_bool().expect("auto"),
        "{config}"
    );
    assert!(
        reason.contains("reach |x| = ") && reason.contains("split 25"),
        "{reason}"
    );
    assert_eq!(chosen, "f16", "{reason}");
    let same = &narrowed
        .iter()
        .find(|(d, _)| *d == chosen)
        .expect("measured")
        .1;
    assert_eq!(bytes(&auto), bytes(same));
    // The same dtype's features, and so its losses, as the other tests compare runs: within
    // 1e-6, not bit for bit: 7.2e-7 was seen once in a full suite (tests running beside this
    // one), never alone. The likely cause (reasoned, not isolated): the host pools the
    // trainer's requests into device batches as they arrive, libtorch's kernels may round a
    // sample's values differently at another batch shape, and f16 rounding turns a last-bit
    // difference into a step. f16 and bf16 differ from f32 by 50 and more times that (printed
    // above).
    let d = max_diff(&losses(&auto), &losses(same));
    assert!(d <= 1e-6, "{reason}: losses differ from {chosen}'s by {d}");
    // An unknown dtype is a usage error naming the choices.
    let o = trainer(
        &fx,
        &host.url,
        &fx.dir.path().join("x.json"),
        &["--wire-dtype", "f8"],
    )
    .output()
    .expect("runs");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("expected f32, f16, bf16 or int8, or auto")
    );
}
