//! Test support: guests built from source, a store with real Fashion-MNIST objects, a policy,
//! and the host serving on a real socket.
#![allow(dead_code)] // each test binary uses a different part

use hapi_host::http::server::Connections;
use hapi_host::policy::{Policy, hash_token};
use hapi_host::{Host, http};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub const ALICE: &str = "alice-token";
pub const BOB: &str = "bob-token";
pub const TIGHT: &str = "tight-token";
pub const CLOCKY: &str = "clocky-token";
/// The operator's token (reads /metrics).
pub const OPERATOR: &str = "operator-token";

pub use hapi_tests::{guest, workspace};

pub struct TestHost {
    pub url: String,
    pub host: Arc<Host>,
    pub store: PathBuf,
    pub policy_path: PathBuf,
    _tmp: tempfile::TempDir,
    pub client: reqwest::Client,
}

/// Fashion-MNIST test-split samples written to `<store>/datasets/fashion-mnist/...`.
pub const SAMPLES: [usize; 6] = [0, 1, 2, 3, 1000, 9999];

pub fn sample_key(i: usize) -> String {
    let data = fashion_test();
    let prefix = object_store::path::Path::from("fashion-mnist");
    hapi_data::fashion_mnist::key(&prefix, "test", data.labels[i], i).to_string()
}

pub fn fashion_test() -> &'static hapi_data::fashion_mnist::Split {
    static S: OnceLock<hapi_data::fashion_mnist::Split> = OnceLock::new();
    S.get_or_init(|| {
        let src = std::env::var_os("HAPI_FASHION_MNIST").map_or_else(
            || PathBuf::from(hapi_data::fashion_mnist::DEFAULT_SOURCE),
            PathBuf::from,
        );
        hapi_data::fashion_mnist::read_split(&src, "t10k")
            .expect("Fashion-MNIST (run `cargo xtask setup`)")
    })
}

/// The test objects: (bucket, key, bytes).
pub fn layout() -> Vec<(&'static str, String, Vec<u8>)> {
    let data = fashion_test();
    let mut objects: Vec<(&str, String, Vec<u8>)> = SAMPLES
        .iter()
        .map(|&i| {
            let png = hapi_data::fashion_mnist::encode_png(data.image(i), 28, 28).expect("png");
            ("datasets", sample_key(i), png)
        })
        .collect();
    objects.extend([
        // Outside alice's grant, in her bucket, and bob's private bucket.
        (
            "datasets",
            "private/notes.txt".into(),
            b"alice may not read this".to_vec(),
        ),
        ("secret", "bob/data.bin".into(), b"bob's data".to_vec()),
        // Byte caps: 1 KiB and 4 KiB.
        (
            "datasets",
            "fashion-mnist/small.bin".into(),
            vec![1u8; 1024],
        ),
        ("datasets", "fashion-mnist/big.bin".into(), vec![2u8; 4096]),
        (
            "datasets",
            "fashion-mnist/corrupt.png".into(),
            b"\x89PNG\r\n\x1a\nnot really".to_vec(),
        ),
    ]);
    objects
}

pub fn write_store(store: &Path) {
    for (bucket, key, bytes) in layout() {
        let path = store.join(bucket).join(key);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    }
}

pub mod components;
pub mod seaweed;

pub fn policy_text(store: &Path, state: &Path) -> String {
    policy_text_for(&format!("store = \"{}\"", store.display()), "", state)
}

/// The test policy with `store_line` for the store and `host_extra` at the end of `[host]`.
pub fn policy_text_for(store_line: &str, host_extra: &str, state: &Path) -> String {
    let models = hapi_model::models_dir();
    format!(
        r#"
[host]
listen = "127.0.0.1:0"
{store_line}
models = "{models}"
state = "{state}"
device = "cpu"
operator_token_sha256 = "{operator}"
{host_extra}

[tenants.alice]
token_sha256 = "{alice}"
grants = [{{ bucket = "datasets", prefix = "fashion-mnist/" }}]
models = ["efficientnet_lite0", "resnet18"]
memory = "512MiB"
timeout = "20s"
deploy = true
[tenants.alice.functions]
feature-extract = "{fe}"
hostile = "{hostile}"

[tenants.bob]
token_sha256 = "{bob}"
grants = [{{ bucket = "secret", prefix = "bob/" }}]
models = ["resnet18"]
[tenants.bob.functions]
feature-extract = "{fe}"
hostile = "{hostile}"

[tenants.tight]
token_sha256 = "{tight}"
grants = [{{ bucket = "datasets", prefix = "fashion-mnist/" }}]
models = ["resnet18"]
memory = "32MiB"
timeout = "1s"
max_output = "64KiB"
max_object = "2KiB"
max_read = "3KiB"
concurrency = 2
queue = 1
[tenants.tight.functions]
hostile = "{hostile}"

[tenants.clocky]
token_sha256 = "{clocky}"
models = ["resnet18"]
timeout = "1s"
capabilities = ["clocks", "random"]
[tenants.clocky.functions]
sleeper = "{sleeper}"
"#,
        models = models.display(),
        state = state.display(),
        operator = hash_token(OPERATOR),
        alice = hash_token(ALICE),
        bob = hash_token(BOB),
        tight = hash_token(TIGHT),
        clocky = hash_token(CLOCKY),
        sleeper = guest("sleeper").display(),
        fe = guest("feature-extract").display(),
        hostile = guest("hostile").display(),
    )
}

/// Token of tenant `t` in [`tenants_policy`].
pub fn tenant_token(t: usize) -> String {
    format!("tenant-{t}-token")
}

/// A policy of `tenants` tenants `t0`, `t1`, ... with the same grant on the test store, each
/// allowed `models` and the feature-extract function, `concurrency` invocations at once and
/// `queue` waiting; `host` is appended to `[host]`, `tenant(t)` to each tenant's table.
pub fn tenants_policy(
    store: &Path,
    state: &Path,
    host: &str,
    tenants: usize,
    models: &[&str],
    tenant: impl Fn(usize) -> String,
) -> String {
    let mut text = format!(
        "[host]\nlisten = \"127.0.0.1:0\"\nstore = \"{}\"\nmodels = \"{}\"\nstate = \"{}\"\ndevice = \"cpu\"\noperator_token_sha256 = \"{}\"\n{host}\n",
        store.display(),
        hapi_model::models_dir().display(),
        state.display(),
        hash_token(OPERATOR)
    );
    let models: Vec<String> = models.iter().map(|m| format!("\"{m}\"")).collect();
    for t in 0..tenants {
        text.push_str(&format!(
            "\n[tenants.t{t}]\ntoken_sha256 = \"{}\"\ngrants = [{{ bucket = \"datasets\", prefix = \"fashion-mnist/\" }}]\nmodels = [{}]\nmemory = \"512MiB\"\ntimeout = \"120s\"\n{}\n[tenants.t{t}.functions]\nfeature-extract = \"{}\"\n",
            hash_token(&tenant_token(t)),
            models.join(", "),
            tenant(t),
            guest("feature-extract").display()
        ));
    }
    text
}

/// The host over a local store holding [`layout`], with the given policy text.
pub async fn start_tenants(policy: impl FnOnce(&Path, &Path) -> String) -> TestHost {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    write_store(&store);
    let text = policy(&store, &tmp.path().join("state"));
    TestHost::start_with(tmp, store, text).await
}

impl TestHost {
    /// The host over a local store holding [`layout`].
    pub async fn start() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = tmp.path().join("store");
        write_store(&store);
        let text = policy_text(&store, &tmp.path().join("state"));
        Self::start_with(tmp, store, text).await
    }

    /// The host with the given policy text; `store` is where tests find local objects.
    pub async fn start_with(tmp: tempfile::TempDir, store: PathBuf, policy: String) -> Self {
        let policy_path = tmp.path().join("policy.toml");
        std::fs::write(&policy_path, policy).expect("policy");
        let policy = Policy::load(&policy_path).expect("policy parses");
        let host = tokio::task::spawn_blocking(move || Host::start(policy))
            .await
            .expect("join")
            .expect("host starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let conns = Arc::new(Connections::default());
        let router = http::router(Arc::clone(&host), Arc::clone(&conns));
        let settings = host.policy().host.http.clone();
        tokio::spawn(http::serve(
            listener,
            router,
            settings,
            conns,
            std::future::pending(),
        ));
        Self {
            url,
            host,
            store,
            policy_path,
            _tmp: tmp,
            client: http_client(),
        }
    }

    /// The metrics text, read with the operator's token.
    pub async fn metrics(&self) -> String {
        metrics_text(&self.client, &self.url, OPERATOR).await
    }

    /// [`warm_at`] this host, giving up after two minutes.
    pub async fn warm(
        &self,
        token: &str,
        function: &str,
        body: serde_json::Value,
    ) -> reqwest::Response {
        let patience = std::time::Duration::from_secs(120);
        warm_at(&self.client, &self.url, token, function, body, patience).await
    }

    pub async fn invoke(
        &self,
        token: &str,
        function: &str,
        body: serde_json::Value,
    ) -> reqwest::Response {
        invoke_at(&self.client, &self.url, token, function, body).await
    }

    /// Writes `text` as the policy and reloads it (what SIGHUP does, on a blocking thread).
    pub async fn reload(&self, text: &str) -> anyhow::Result<Vec<String>> {
        std::fs::write(&self.policy_path, text).expect("write the policy");
        let policy = Policy::load(&self.policy_path).expect("the policy parses");
        let host = Arc::clone(&self.host);
        tokio::task::spawn_blocking(move || host.reload(policy))
            .await
            .expect("join")
    }

    /// `DELETE /v1/functions/{name}` with `token`.
    pub async fn delete_function(&self, token: &str, name: &str) -> reqwest::Response {
        self.client
            .delete(format!("{}/v1/functions/{name}", self.url))
            .bearer_auth(token)
            .send()
            .await
            .expect("request")
    }

    /// `PUT /v1/functions/{name}` with `token` and the component `body`.
    pub async fn put_function(&self, token: &str, name: &str, body: Vec<u8>) -> reqwest::Response {
        self.client
            .put(format!("{}/v1/functions/{name}", self.url))
            .bearer_auth(token)
            .body(body)
            .send()
            .await
            .expect("request")
    }
}

/// `GET {url}/v1/models/{model}/profile`, read with tenant 0's token.
pub async fn profile_at(
    client: &reqwest::Client,
    url: &str,
    model: &str,
) -> hapi_wire::profile::ModelProfile {
    client
        .get(format!("{url}/v1/models/{model}/profile"))
        .bearer_auth(tenant_token(0))
        .send()
        .await
        .expect("profile request")
        .json()
        .await
        .expect("profile")
}

/// A client for the hosts under test. A kept-alive connection idle for the host's
/// `header_timeout` (10 s by default) is closed by the host; a request sent on it just then
/// fails (hyper's `IncompleteMessage`), so the client lets idle connections go sooner.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(5))
        .build()
        .expect("HTTP client")
}

/// `POST {url}/v1/invoke/{function}` with `token` and the JSON `body`.
pub async fn invoke_at(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    function: &str,
    body: serde_json::Value,
) -> reqwest::Response {
    client
        .post(format!("{url}/v1/invoke/{function}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request")
}

/// Invokes until the call succeeds: for a first call, which a short time limit may end while
/// the model loads (429 `device_busy`) or while a loaded machine is slow (422
/// `time_limit_exceeded`); the load goes on meanwhile. Gives up after `patience` and returns
/// the last answer.
pub async fn warm_at(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    function: &str,
    body: serde_json::Value,
    patience: std::time::Duration,
) -> reqwest::Response {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let resp = invoke_at(client, url, token, function, body.clone()).await;
        let retry =
            matches!(resp.status().as_u16(), 422 | 429) && std::time::Instant::now() < deadline;
        if !retry {
            return resp;
        }
        let text = resp.text().await.unwrap_or_default();
        assert!(
            text.contains("device_busy") || text.contains("time_limit_exceeded"),
            "{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// The error code of a JSON error response, after checking its status.
pub async fn error_code(resp: reqwest::Response, status: u16) -> (String, String) {
    let got = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.expect("JSON error body");
    assert_eq!(got, status, "{body}");
    (
        body["code"].as_str().expect("code").to_string(),
        body["message"].as_str().expect("message").to_string(),
    )
}

/// The `features` tensor of a successful safetensors response: shape and raw bytes.
async fn tensor(resp: reqwest::Response) -> (Vec<usize>, Vec<u8>) {
    let status = resp.status();
    let bytes = resp.bytes().await.expect("body");
    assert!(
        status.is_success(),
        "{status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let t = st.tensor("features").expect("features tensor");
    (t.shape().to_vec(), t.data().to_vec())
}

/// The `features` tensor of a safetensors response: shape and f32 values.
pub async fn features(resp: reqwest::Response) -> (Vec<usize>, Vec<f32>) {
    let (shape, bytes) = tensor(resp).await;
    let values = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, values)
}

/// The bytes of a u8 `features` tensor.
pub async fn raw(resp: reqwest::Response) -> Vec<u8> {
    tensor(resp).await.1
}

/// A host's `/metrics` text, read with `operator`'s token.
pub async fn metrics_text(client: &reqwest::Client, url: &str, operator: &str) -> String {
    client
        .get(format!("{url}/metrics"))
        .bearer_auth(operator)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// An invocation of the hostile guest: its `mode`, more options, and `keys` of bucket
/// `datasets` (model and split are not used by it).
pub fn hostile(mode: &str, extra: &[(&str, &str)], keys: &[&str]) -> serde_json::Value {
    let mut options = serde_json::Map::new();
    options.insert("mode".into(), mode.into());
    for (k, v) in extra {
        options.insert((*k).into(), (*v).into());
    }
    serde_json::json!({"bucket": "datasets", "keys": keys, "model": "resnet18", "split": 0, "options": options})
}

/// A memory field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in bytes (0 where unknown).
pub fn proc_memory(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A bench's command line (`cargo xtask bench ...` passes `--out` and the user's flags).
pub struct BenchArgs(Vec<String>);

impl BenchArgs {
    pub fn from_env() -> Self {
        Self(std::env::args().collect())
    }

    /// The word after `flag`'s last occurrence (the user's flags come after xtask's).
    pub fn value(&self, flag: &str) -> Option<String> {
        self.0
            .iter()
            .rposition(|a| a == flag)
            .and_then(|i| self.0.get(i + 1).cloned())
    }

    /// Whether `flag` is there.
    pub fn has(&self, flag: &str) -> bool {
        self.0.iter().any(|a| a == flag)
    }

    /// `--out`, or `target/bench` in the workspace.
    pub fn out(&self) -> PathBuf {
        self.value("--out")
            .map_or_else(|| workspace().join("target/bench"), PathBuf::from)
    }
}

/// A device job for `tenant` on `pin`: `n` zero images of 3x224x224 through layers [0, 1), with
/// an account of its own (1 GiB) and a time limit of `limit`, its output f32.
pub fn device_job(
    tenant: &Arc<str>,
    pin: hapi_host::device::budget::Pin,
    n: i64,
    limit: std::time::Duration,
) -> hapi_host::device::job::Job {
    use hapi_host::account::{Account, Deadline};
    let account = Account::new(1 << 30);
    let bytes = vec![0u8; usize::try_from(n).expect("samples") * 3 * 224 * 224 * 4];
    hapi_host::device::job::Job {
        tenant: Arc::clone(tenant),
        weight: 1,
        pin,
        range: 0..1,
        input: hapi_host::device::job::Input {
            charge: account.charge(bytes.len() as u64, "input").expect("charge"),
            bytes,
            shape: vec![3, 224, 224],
            n,
        },
        out: hapi_wire::tensor::WireDtype::F32,
        account,
        deadline: Arc::new(Deadline::new(limit)),
        slot: None,
        usage: Arc::default(),
    }
}
