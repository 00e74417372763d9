//! The HTTP API over a real socket: authentication, routing, models, health and metrics.

mod common;

use common::{ALICE, TIGHT, TestHost, error_code, sample_key};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_tokens_are_401() {
    let h = TestHost::start().await;
    let url = format!("{}/v1/invoke/feature-extract", h.url);
    let resp = h
        .client
        .post(&url)
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(
        resp.headers().get("www-authenticate").expect("challenge"),
        "Bearer"
    );
    assert_eq!(error_code(resp, 401).await.0, "unauthenticated");
    let resp = h
        .client
        .post(&url)
        .bearer_auth("not-a-token")
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(error_code(resp, 401).await.0, "bad_token");
    let resp = h
        .client
        .get(format!("{}/v1/models", h.url))
        .header("authorization", "Basic abc")
        .send()
        .await
        .expect("request");
    assert_eq!(error_code(resp, 401).await.0, "unauthenticated");
    // No tenant to charge them to: counted apart, by code.
    let metrics = h.metrics().await;
    for line in [
        "hapi_unauthenticated_total{code=\"unauthenticated\"} 2",
        "hapi_unauthenticated_total{code=\"bad_token\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoking_a_function_the_tenant_does_not_own_is_404() {
    let h = TestHost::start().await;
    // `tight` has only `hostile`; `feature-extract` is alice's and bob's.
    let body =
        json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "resnet18", "split": 1});
    let (code, message) = error_code(h.invoke(TIGHT, "feature-extract", body).await, 404).await;
    assert_eq!(code, "function_not_found");
    assert!(
        message.contains("tenant `tight` has no function `feature-extract`"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_400() {
    let h = TestHost::start().await;
    let resp = h
        .client
        .post(format!("{}/v1/invoke/feature-extract", h.url))
        .bearer_auth(ALICE)
        .body("{\"bucket\": ")
        .send()
        .await
        .expect("request");
    assert_eq!(error_code(resp, 400).await.0, "bad_json");
    let body =
        json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 1, "batch": 4});
    let (code, message) = error_code(h.invoke(ALICE, "feature-extract", body).await, 400).await;
    assert_eq!(code, "bad_json");
    assert!(message.contains("unknown field `batch`"), "{message}");
    let body = json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "resnet18", "split": 1, "options": {"resize": "128"}});
    let (code, message) = error_code(h.invoke(ALICE, "feature-extract", body).await, 400).await;
    assert_eq!(code, "bad_request");
    assert!(
        message.contains("takes one option, `dtype` (got `resize`)"),
        "{message}"
    );
    let body = json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "resnet18", "split": 1, "options": {"dtype": "int4"}});
    let (code, message) = error_code(h.invoke(ALICE, "feature-extract", body).await, 400).await;
    assert_eq!(code, "bad_request");
    assert!(
        message.contains("dtype `int4`: expected f32, f16 or bf16"),
        "{message}"
    );
    let body = json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "resnet18", "split": 0, "options": {"dtype": "f16"}});
    let (code, message) = error_code(h.invoke(ALICE, "feature-extract", body).await, 400).await;
    assert_eq!(code, "bad_request");
    assert!(message.contains("needs split >= 1"), "{message}");
    let resp = h
        .client
        .get(format!("{}/v2/nothing", h.url))
        .send()
        .await
        .expect("request");
    assert_eq!(error_code(resp, 404).await.0, "no_route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_per_tenant_and_profiled_on_this_device() {
    let h = TestHost::start().await;
    let models: serde_json::Value = h
        .client
        .get(format!("{}/v1/models", h.url))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = models
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(names, ["efficientnet_lite0", "resnet18"]);
    let resp = h
        .client
        .get(format!("{}/v1/models/resnet18/profile", h.url))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 200);
    let profile: serde_json::Value = resp.json().await.expect("json");
    let layers = profile["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 15);
    assert!(
        layers
            .iter()
            .all(|l| l["seconds_per_sample"].as_f64().is_some_and(|s| s > 0.0)),
        "{profile}"
    );
    assert_eq!(layers[0]["output_bytes_per_sample"], 64 * 112 * 112 * 4);
    let resp = h
        .client
        .get(format!("{}/v1/models/vgg11/profile", h.url))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("get");
    assert_eq!(error_code(resp, 404).await.0, "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics() {
    let h = TestHost::start().await;
    let health = h
        .client
        .get(format!("{}/healthz", h.url))
        .send()
        .await
        .expect("get");
    assert_eq!(health.status(), 200);
    let body =
        json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "resnet18", "split": 1});
    let resp = h.warm(ALICE, "feature-extract", body).await;
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let text = h.metrics().await;
    assert!(
        text.contains(
            r#"hapi_invocations_total{tenant="alice",function="feature-extract",code="ok"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains("# TYPE hapi_compute_seconds_total counter"),
        "{text}"
    );
}

/// A request refused before its handler reads the body (a bad token, a bad name, no route) is
/// answered while its body is still being sent: the host reads and drops the body before it
/// answers, so the client can send all of it, gets the answer, and keeps the connection (before,
/// the host answered at once and closed the connection under the client, which got a broken
/// pipe or a reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_its_token_or_name_is_answered_while_its_body_is_sent() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = TestHost::start().await;
    let addr = h.url.trim_start_matches("http://").to_string();
    const CHUNK: usize = 256 << 10;
    const CHUNKS: usize = 16;
    for (request, token, status, code) in [
        ("PUT /v1/functions/mine", "not-a-token", 401, "bad_token"),
        ("PUT /v1/functions/a%00b", ALICE, 400, "bad_name"),
        ("POST /v1/invoke/..%2Fx", ALICE, 400, "bad_name"),
        ("POST /v1/nowhere", ALICE, 404, "no_route"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let (mut rd, mut wr) = conn.split();
        let head = format!(
            "{request} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
            CHUNK * CHUNKS
        );
        // The body trickles in over about 0.3 s, long after the answer is known.
        let write = async {
            wr.write_all(head.as_bytes()).await?;
            for _ in 0..CHUNKS {
                wr.write_all(&[7u8; CHUNK]).await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            std::io::Result::Ok(())
        };
        let read = async {
            let mut answer = Vec::new();
            let mut buf = [0u8; 4096];
            // Until the JSON body's end: the connection stays open.
            while !answer.ends_with(b"}") {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&answer).into_owned()
        };
        let (written, answer) =
            tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(write, read) })
                .await
                .expect("answered within 30 s");
        assert!(
            written.is_ok(),
            "{request}: the body could not be sent: {written:?}; answer {answer:?}"
        );
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} "))
                && answer.contains(&format!("\"code\":\"{code}\"")),
            "{request}: {answer}"
        );
    }
}

/// A connection from `ip` that sends half a request's head and waits.
async fn half_sent(ip: [u8; 4], url: &str) -> tokio::net::TcpStream {
    half_sent_as(ip, url, "GET /healthz").await
}

/// [`half_sent`], with another request line's method and path.
async fn half_sent_as(ip: [u8; 4], url: &str, request: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((ip, 0)))
        .expect("bind a loopback address");
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().expect("address");
    let mut conn = socket.connect(addr).await.expect("connect");
    conn.write_all(format!("{request} HTTP/1.1\r\nhost: x\r\n").as_bytes())
        .await
        .expect("half a head");
    conn
}

/// Whether the host closed `conn` (it reads end of stream within 5 s).
async fn closed(conn: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A host with `host_extra` over the test store, and alice's invocation of about a second
/// admitted (so authenticated: its connection busy); the host and the invocation's task.
async fn with_an_invocation_in_flight(
    host_extra: &str,
) -> (
    TestHost,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    common::write_store(&store);
    let text = common::policy_text_for(
        &format!("store = \"{}\"", store.display()),
        host_extra,
        &tmp.path().join("state"),
    );
    let h = TestHost::start_with(tmp, store, text).await;
    let _ = common::guest("hostile");
    let spin = h.client.post(format!("{}/v1/invoke/hostile", h.url))
        .bearer_auth(ALICE)
        .json(&json!({"bucket": "datasets", "keys": [], "options": {"mode": "spin", "iterations": "1500000000"}}))
        .send();
    let in_flight = tokio::spawn(spin);
    let alice = std::sync::Arc::clone(&h.host.policy().tenants["alice"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while h.host.admission(&alice).load().0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the invocation never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    (h, in_flight)
}

/// The invocation of [`with_an_invocation_in_flight`] answered in full.
async fn ran_to_its_end(in_flight: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    let done = in_flight
        .await
        .expect("join")
        .expect("the invocation ran to its end");
    assert_eq!(common::raw(done).await, 1_500_000_000u64.to_le_bytes());
}

/// Clients from other addresses, each within its cap and without a token, hold every
/// connection: four with requests whose bodies they withhold (the host waits for an unread body
/// before it answers), three with half-sent heads. A tenant's request still gets in, closing
/// the oldest connection that carries no tenant's request, never one that does (here an
/// invocation older than all of them). The tenant's connection had been closed at once; a first
/// version of the fix counted a connection as busy from any request's head, so withheld bodies
/// held connections it never closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_tenants_request_make_room_for_one() {
    use tokio::io::AsyncWriteExt;
    let (h, in_flight) = with_an_invocation_in_flight(
        "max_connections = 8\nmax_connections_per_client = 4\nheader_timeout = \"60s\"",
    )
    .await;
    // With the invocation's, every connection is taken.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut conn = half_sent([127, 0, 0, 2], &h.url).await;
        conn.write_all(b"content-type: application/json\r\ncontent-length: 10\r\n\r\n")
            .await
            .expect("a head, and no body");
        held.push(conn);
    }
    for _ in 0..3 {
        held.push(half_sent([127, 0, 0, 3], &h.url).await);
    }
    let fresh = common::http_client();
    let healthy = fresh
        .get(format!("{}/healthz", h.url))
        .send()
        .await
        .expect("a tenant's request gets a connection");
    assert_eq!(healthy.status(), 200);
    assert!(closed(&mut held[0]).await, "the oldest connection stays");
    assert!(!closed(&mut held[1]).await, "more than one was closed");
    ran_to_its_end(in_flight).await;
}

/// A tenant holds at most its cap of connections busy (here 5: one invocation, no queue, and
/// four for other requests). Tenant `pipe` opens every connection the host takes, from two
/// addresses, and on each pipelines thousands of lists of models (which take no slot) and
/// reads none of the answers, so that each connection's next answer waits to be written: its
/// requests past the cap are answered 429, and a newcomer closes one of the connections past
/// it. Every connection had stayed busy and the newcomer was closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_no_more_connections_busy_than_its_cap() {
    use tokio::io::AsyncWriteExt;
    const PIPE: &str = "pipe-token";
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    common::write_store(&store);
    let text = format!(
        "{}\n[tenants.pipe]\ntoken_sha256 = \"{}\"\ngrants = []\nmodels = [\"efficientnet_lite0\", \"resnet18\"]\nconcurrency = 1\nqueue = 0\n",
        common::policy_text_for(
            &format!("store = \"{}\"", store.display()),
            "max_connections = 8\nmax_connections_per_client = 4",
            &tmp.path().join("state"),
        ),
        hapi_host::policy::hash_token(PIPE)
    );
    let h = TestHost::start_with(tmp, store, text).await;
    let addr: std::net::SocketAddr = h
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let lists =
        format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {PIPE}\r\n\r\n")
            .repeat(20_000);
    let mut unread = Vec::new();
    for ip in [[127, 0, 0, 2], [127, 0, 0, 3]] {
        for _ in 0..4 {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.set_recv_buffer_size(1024).expect("a small window");
            socket
                .bind(std::net::SocketAddr::from((ip, 0)))
                .expect("bind a loopback address");
            let conn = socket.connect(addr).await.expect("connect");
            let (read, mut write) = conn.into_split();
            let lists = lists.clone();
            // Writes until the host stops reading (its answers unwritten), and waits there.
            unread.push((
                read,
                tokio::spawn(async move {
                    let _ = write.write_all(lists.as_bytes()).await;
                    write
                }),
            ));
        }
    }
    // The host answers until each connection's socket buffers are full.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let healthy = common::http_client()
        .get(format!("{}/healthz", h.url))
        .send()
        .await
        .expect("a newcomer gets a connection");
    assert_eq!(healthy.status(), 200);
    // Its requests past the cap were answered 429 at once.
    let refused = h
        .metrics()
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "hapi_refused_total{tenant=\"pipe\",endpoint=\"connections\",code=\"busy\"} ",
            )
            .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    assert!(refused > 0, "no request past the cap was refused");
    for (_, writer) in &unread {
        writer.abort();
    }
}

/// A tenant's request whose body is withheld does not hold its connection busy while the host
/// drains the body, whether a handler refused it (an unknown function) or answered without
/// reading it (a GET with a body): with the other connection busy with an invocation, a
/// newcomer closes it. It was held for the body's timeout, outside the tenant's admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_withheld_body_does_not_hold_its_connection_busy() {
    use tokio::io::AsyncWriteExt;
    let _ = common::guest("hostile");
    for request in ["POST /v1/invoke/nothing-of-that-name", "GET /v1/models"] {
        let (h, in_flight) =
            with_an_invocation_in_flight("max_connections = 2\nmax_connections_per_client = 2")
                .await;
        let mut withheld = half_sent_as([127, 0, 0, 2], &h.url, request).await;
        withheld
            .write_all(
                format!("authorization: Bearer {ALICE}\r\ncontent-length: 10\r\n\r\n").as_bytes(),
            )
            .await
            .expect("a head, and no body");
        // Authenticated meanwhile (on the code before the fix, busy from then on).
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let healthy = common::http_client()
            .get(format!("{}/healthz", h.url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{request}: no connection for a newcomer: {e}"));
        assert_eq!(healthy.status(), 200);
        assert!(
            closed(&mut withheld).await,
            "{request}: its withheld body held it"
        );
        ran_to_its_end(in_flight).await;
    }
}
