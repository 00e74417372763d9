//! The `hapi-host` binary as operators run it: SIGHUP reloads the policy without dropping
//! in-flight work, SIGTERM finishes in-flight invocations before exiting, and at its open-file
//! limit it sheds connections instead of stopping to answer.

mod common;

use common::{ALICE, BOB, guest, policy_text, raw};
use hapi_tests::HostProcess;
use serde_json::json;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) with the pid of a child this test spawned and still owns.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill failed");
}

fn start(policy: &Path) -> HostProcess {
    HostProcess::serve(
        &hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host")),
        policy,
        "127.0.0.1:0",
    )
}

/// The test policy with bob's section removed (bob's tenant table and functions).
fn without_bob(text: &str) -> String {
    let start = text.find("[tenants.bob]").expect("bob");
    let end = text.find("[tenants.tight]").expect("tight");
    format!("{}{}", &text[..start], &text[end..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_policy_and_sigterm_finishes_in_flight_work() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    std::fs::create_dir_all(store.join("secret/bob")).expect("mkdir");
    std::fs::write(store.join("secret/bob/data.bin"), b"bob's data").expect("write");
    let full = policy_text(&store, &tmp.path().join("state"));
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, without_bob(&full)).expect("policy");
    let _ = guest("hostile");
    let mut server = start(&policy);
    let client = common::http_client();
    let bob_reads = || {
        client
            .post(format!("{}/v1/invoke/hostile", server.url))
            .bearer_auth(BOB)
            .json(&json!({"bucket": "secret", "keys": ["bob/data.bin"], "model": "resnet18", "split": 0, "options": {"mode": "read"}}))
            .send()
    };
    assert_eq!(bob_reads().await.expect("request").status(), 401);

    // A long invocation is in flight while the policy is reloaded.
    let spin = |url: String| {
        let client = client.clone();
        async move {
            client
                .post(format!("{url}/v1/invoke/hostile"))
                .bearer_auth(ALICE)
                .json(&json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "spin", "iterations": "1500000000"}}))
                .send()
                .await
                .expect("request")
        }
    };
    let in_flight = tokio::spawn(spin(server.url.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(&policy, &full).expect("policy with bob");
    signal(&server.child, libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = bob_reads().await.expect("request");
        if resp.status() == 200 {
            assert_eq!(raw(resp).await, b"bob's data");
            break;
        }
        assert!(Instant::now() < deadline, "bob was never let in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = in_flight.await.expect("join");
    assert_eq!(raw(done).await, 1_500_000_000u64.to_le_bytes());

    // SIGTERM during an invocation: it completes, then the process exits cleanly.
    let in_flight = tokio::spawn(spin(server.url.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&server.child, libc::SIGTERM);
    let done = in_flight.await.expect("join");
    assert_eq!(raw(done).await, 1_500_000_000u64.to_le_bytes());
    let status = exited(&mut server, "after SIGTERM, its invocation done");
    assert!(status.success(), "{status}");
}

/// A SIGHUP while the host starts (here while it measures its models) is a reload once it is
/// up (the start read the policy before it): it ended the process (SIGHUP's default action, before the handler was installed), a
/// clean exit to a service manager, which did not restart it.
#[test]
fn a_sighup_while_the_host_starts_does_not_stop_it() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    std::fs::create_dir_all(&store).expect("store");
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, policy_text(&store, &tmp.path().join("state"))).expect("policy");
    let binary = hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host"));
    let mut child = std::process::Command::new(binary)
        .args(["serve", "--policy"])
        .arg(&policy)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hapi-host starts");
    let mut log = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let measuring = log
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("loading and measuring"));
    assert!(measuring, "the host logged no measurement at its start");
    signal(&child, libc::SIGHUP);
    let (reloaded, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in log.map_while(Result::ok) {
            if line.contains("policy reloaded") {
                let _ = reloaded.send(());
            }
        }
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let status = child.try_wait().expect("wait");
    let reload = said.recv_timeout(Duration::from_secs(30));
    signal(&child, libc::SIGTERM);
    let _ = child.wait();
    assert!(
        line.starts_with("listening on "),
        "the host served after a SIGHUP at its start: first line {line:?}, exit {status:?}"
    );
    assert!(status.is_none(), "and was running: {status:?}");
    assert!(reload.is_ok(), "and reloaded its policy once it was up");
}

/// Waits (30 s at most) for the host to exit after a signal; its exit status.
fn exited(server: &mut HostProcess, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "hapi-host did not exit: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client that takes a response and reads none of it (or a byte now and then, within
/// `idle_timeout`) holds its connection open; on SIGTERM the host waits for it no longer than
/// `shutdown_timeout`, then closes it and exits (it had waited for the connection to end, until
/// the service manager's kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_host_within_its_shutdown_timeout_whatever_a_client_reads() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    // A free port for the metrics listener.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let text = common::policy_text_for(
        &format!("store = \"{}\"", store.display()),
        &format!(
            "idle_timeout = \"600s\"\nshutdown_timeout = \"1s\"\nmetrics_listen = \"{metrics}\""
        ),
        &tmp.path().join("state"),
    );
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, text).expect("policy");
    let _ = guest("hostile");
    let mut server = start(&policy);
    let addr = server.url.trim_start_matches("http://").to_string();

    // 48 MiB of output, far more than the sockets buffer; the client reads its head only.
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0,
        "options": {"mode": "output", "bytes": "50331648"}})
    .to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    conn.write_all(
        format!(
            "POST /v1/invoke/hostile HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            ALICE,
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(60), conn.read(&mut byte))
            .await
            .expect("the response's head")
            .expect("read");
        assert_eq!(n, 1, "closed before the response's head: {head:?}");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    // The metrics listener reports the API's connections (it had none of its own to report).
    let text = common::http_client()
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(text.contains("\nhapi_http_connections 1\n"), "{text}");

    let stopping = Instant::now();
    signal(&server.child, libc::SIGTERM);
    let status = exited(&mut server, "a client holds a response unread");
    println!("exited {:?} after SIGTERM", stopping.elapsed());
    assert!(status.success(), "{status}");
    drop(conn);
}

/// The open-file limit an operator's service manager might set; the host keeps 128
/// descriptors for itself and serves at most the rest as connections.
const FILES: u64 = 256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_open_file_limit_the_host_sheds_connections_and_recovers() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    let text = common::policy_text_for(
        &format!("store = \"{}\"", store.display()),
        "header_timeout = \"3s\"",
        &tmp.path().join("state"),
    );
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, text).expect("policy");
    let _ = guest("hostile");
    let server = HostProcess::serve_with(
        &hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host")),
        &policy,
        "127.0.0.1:0",
        |command| {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe and touches only the child.
            unsafe {
                command.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: FILES,
                        rlim_max: FILES,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        },
    );
    let addr = server.url.trim_start_matches("http://").to_string();

    // More half-sent requests than the host has descriptors.
    let started = Instant::now();
    let mut conns = Vec::new();
    for _ in 0..2 * FILES {
        let Ok(Ok(mut c)) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(&addr),
        )
        .await
        else {
            continue;
        };
        use tokio::io::AsyncWriteExt;
        if c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .is_ok()
        {
            conns.push(c);
        }
    }
    // Those past the host's share of descriptors were shed at once; the rest are held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = 0;
    for c in &mut conns {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(5), c.read(&mut byte)).await;
        if read.is_err() {
            held += 1;
        }
    }
    println!(
        "{} connections opened in {:?}, {held} held",
        conns.len(),
        started.elapsed()
    );
    assert!(held > 0 && held <= (FILES - 128) as usize, "{held} held");

    // The header timeout frees them; then everyone is answered again.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let deadline = started + Duration::from_secs(15);
    let healthy = loop {
        let ok = client
            .get(format!("{}/healthz", server.url))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ok || Instant::now() > deadline {
            break ok;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        healthy,
        "/healthz unanswered {:?} after the attack",
        started.elapsed()
    );
    let resp = client
        .post(format!("{}/v1/invoke/hostile", server.url))
        .bearer_auth(ALICE)
        .json(&json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "output", "bytes": "3"}}))
        .send()
        .await
        .expect("invoke");
    assert_eq!(raw(resp).await, [7, 7, 7]);
    println!(
        "served again {:?} after the attack began",
        started.elapsed()
    );
    drop(conns);
}

/// `hapi-host measure` at install time keeps the memory models that `serve` then uses: it
/// measures with the libtorch threads the device's batches will have (`share_cores`), under
/// the key that names them. It had measured with libtorch's default threads, whose key
/// `serve` did not look for, so every model was measured again when the host started (on a
/// machine with one core the two counts are the same, and this cannot tell them apart).
#[test]
fn models_measured_at_install_time_are_the_ones_serve_uses() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    let state = tmp.path().join("state");
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, policy_text(&store, &state)).expect("policy");
    let _ = guest("hostile");
    let binary = hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host"));
    // As operators run it: `cargo xtask test` sets OMP_NUM_THREADS, which `share_cores`
    // would leave to libtorch.
    let out = std::process::Command::new(&binary)
        .args(["measure", "--policy"])
        .arg(&policy)
        .env_remove("OMP_NUM_THREADS")
        .output()
        .expect("run hapi-host measure");
    assert!(
        out.status.success(),
        "hapi-host measure: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kept = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(state.join("memory"))
            .expect("the kept memory models")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    let measured = kept();
    assert!(
        measured.len() >= 2,
        "measure kept {measured:?} for the policy's two models"
    );
    // `serve` measures every usable model before it listens (`measure_at_start`, on by
    // default), or finds it kept.
    drop(HostProcess::serve_with(
        &binary,
        &policy,
        "127.0.0.1:0",
        |c| {
            c.env_remove("OMP_NUM_THREADS");
        },
    ));
    assert_eq!(
        kept(),
        measured,
        "serve kept memory models of its own beside those `measure` kept"
    );
}
