//! The deploy path: uploads are checked before they are compiled, names are checked on every
//! route, quotas hold, the operator's functions cannot be touched through the API, and compiled
//! code is kept per tenant and removed with the function.

mod common;

use common::components::{
    component, declaring, defining, defining_many, exporting_an_instance, guest_with, importing,
    imports_of, instantiating, instantiating_an_import, instantiating_nested, instantiating_types,
    memories_and_tables, module, named, nesting_types, rec_typing, string_encoding, trapping_named,
    typing, variant,
};
use common::{ALICE, BOB, TestHost, error_code, guest, raw, start_tenants, tenant_token};
use hapi_host::Host;
use hapi_host::policy::{Policy, hash_token};
use hapi_host::wasm::compile::{self, DeployError};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

fn wasm(name: &str) -> Vec<u8> {
    std::fs::read(guest(name)).expect("guest")
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_that_are_not_granted_components_are_rejected_before_compiling() {
    let h = TestHost::start().await;
    let limit = compile::MAX_FUNCTION_BODY;
    for (body, needle) in [
        (b"hello".to_vec(), "not WebAssembly"),
        (b"\0asm\x01\0\0\0".to_vec(), "core Wasm module"),
        (b"\0asm\x0d\0\x01\0garbage".to_vec(), "does not validate"),
        (wasm("fs-reader"), "wasi:filesystem/preopens@0.2.6"),
        // Within the body limit but not the world: no `run`.
        (component(&[module(1, 1000)]), "exports no `run`"),
        (
            guest_with("hostile", &[module(1, limit + 16)]),
            "a function body of",
        ),
    ] {
        let started = Instant::now();
        let (code, message) = error_code(h.put_function(ALICE, "mine", body).await, 422).await;
        assert_eq!(code, "bad_component", "{message}");
        assert!(message.contains(needle), "{needle}: {message}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{needle}: {:?}",
            started.elapsed()
        );
    }
    // Nothing was compiled, nothing was kept.
    let state = h.policy_path.with_file_name("state");
    assert!(
        files(&state.join("compiled/alice"))
            .iter()
            .all(|f| !f.contains("tmp"))
    );
    assert!(files(&state.join("functions/alice")).is_empty());
    // A tenant without the deploy right cannot upload at all.
    let (code, _) = error_code(h.put_function(BOB, "mine", wasm("hostile")).await, 403).await;
    assert_eq!(code, "deploy_not_allowed");
    // The operator sees all of it, charged to the tenant that sent it: six uploads the
    // compiler took and rejected, with the time it spent on them, and one refused at the door.
    let metrics = h.metrics().await;
    for line in [
        "hapi_uploads_total{tenant=\"alice\",code=\"bad_component\"} 6",
        "hapi_refused_total{tenant=\"bob\",endpoint=\"deploy\",code=\"deploy_not_allowed\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
    assert!(
        compile_seconds(&metrics, "alice", "bad_component") > 0.0,
        "{metrics}"
    );
    assert!(
        !metrics.contains("hapi_uploads_total{tenant=\"bob\""),
        "{metrics}"
    );
}

/// The `hapi_compile_seconds_total` of `tenant`'s uploads that ended with `code`.
fn compile_seconds(metrics: &str, tenant: &str, code: &str) -> f64 {
    let series = format!("hapi_compile_seconds_total{{tenant=\"{tenant}\",code=\"{code}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series}in\n{metrics}"))
}

/// Waits (up to 60 s) until an upload is being compiled.
async fn until_compiling(h: &TestHost) {
    let until = Instant::now() + Duration::from_secs(60);
    while h.host.uploads_compiling() == 0 {
        assert!(
            Instant::now() < until,
            "the upload never reached the compiler"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A component that instantiates a module many times, each instance holding a memory, a table
/// or only its place, took slots of the pooling allocator that every tenant's instances share:
/// 250 memories of 0 pages cost its memory limit nothing and left the other tenants' calls 429
/// `busy` for as long as its own ran. What one component instance may hold is bounded, the
/// pool's totals are the instance limit times those bounds, and an upload past them is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_that_would_take_other_tenants_instance_slots_are_refused() {
    let h = TestHost::start().await;
    for (item, times, needle) in [
        (
            Some(5),
            3,
            "Wasm linear memories, which exceeds the configured maximum of 2",
        ),
        (
            Some(4),
            3,
            "tables, which exceeds the configured maximum of 4",
        ),
        (
            None,
            20,
            "core module instances, which exceeds the configured maximum of 16",
        ),
    ] {
        let body = instantiating("hostile", &defining(item), times);
        let (code, message) = error_code(h.put_function(ALICE, "pool", body).await, 422).await;
        assert_eq!(code, "bad_component", "{message}");
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // Within the bounds (a second memory, as a second module of the component may have), it is
    // deployed and runs.
    let body = instantiating("hostile", &defining(Some(5)), 1);
    assert_eq!(h.put_function(ALICE, "pool", body).await.status(), 201);
    let call = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "output", "bytes": "3"}});
    assert_eq!(raw(h.invoke(ALICE, "pool", call).await).await, [7, 7, 7]);
}

/// Deploys alice's own function `mine` (a variant of `hostile`); gives its sha256.
async fn deploy_mine(h: &TestHost) -> String {
    let resp = h
        .put_function(ALICE, "mine", variant("hostile", "mine"))
        .await;
    assert_eq!(resp.status(), 201);
    let info: serde_json::Value = resp.json().await.expect("json");
    info["sha256"].as_str().expect("sha256").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_function_is_invoked_listed_and_removed_with_its_code() {
    let h = TestHost::start().await;
    let state = h.policy_path.with_file_name("state");
    let sha = deploy_mine(&h).await;
    // Compiled once, kept in the tenant's own cache for restarts.
    let cached = || {
        files(&state.join("compiled/alice"))
            .into_iter()
            .filter(|f| f.starts_with(&sha))
            .count()
    };
    assert_eq!(cached(), 1);
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "output", "bytes": "3"}});
    assert_eq!(
        raw(h.invoke(ALICE, "mine", body.clone()).await).await,
        [7, 7, 7]
    );
    let list: serde_json::Value = h
        .client
        .get(format!("{}/v1/functions", h.url))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let names: Vec<(&str, bool)> = list
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|f| Some((f["name"].as_str()?, f["managed"].as_bool()?)))
        .collect();
    assert_eq!(
        names,
        [
            ("feature-extract", true),
            ("hostile", true),
            ("mine", false)
        ]
    );
    // Other tenants do not see it.
    let (code, _) = error_code(h.invoke(BOB, "mine", body.clone()).await, 404).await;
    assert_eq!(code, "function_not_found");
    // Redeployed with other bytes: the old code goes.
    assert_eq!(
        h.put_function(ALICE, "mine", wasm("sleeper"))
            .await
            .status(),
        422,
        "not granted clocks"
    );
    assert_eq!(
        h.put_function(ALICE, "mine", variant("hostile", "mine-2"))
            .await
            .status(),
        201
    );
    assert_eq!(cached(), 0, "the replaced version's code is removed");
    assert_eq!(h.delete_function(ALICE, "mine").await.status(), 204);
    assert_eq!(h.delete_function(ALICE, "mine").await.status(), 404);
    assert_eq!(h.delete_function(ALICE, "hostile").await.status(), 409);
    let (code, _) = error_code(h.invoke(ALICE, "mine", body).await, 404).await;
    assert_eq!(code, "function_not_found");
    assert!(files(&state.join("functions/alice")).is_empty());
    // Only the policy's own functions' code is left.
    assert_eq!(files(&state.join("compiled/alice")).len(), 2);
    // Its metrics are kept in the tenant's series of removed functions.
    let metrics = h.metrics().await;
    assert!(!metrics.contains("function=\"mine\""), "{metrics}");
    // Two uploads compiled and one rejected, and each tenant's call to a function it does
    // not have, counted as refused (the name it asked for is not a label).
    for line in [
        "hapi_invocations_total{tenant=\"alice\",function=\"(removed)\",code=\"ok\"} 1",
        "hapi_uploads_total{tenant=\"alice\",code=\"ok\"} 2",
        "hapi_uploads_total{tenant=\"alice\",code=\"bad_component\"} 1",
        "hapi_refused_total{tenant=\"alice\",endpoint=\"invoke\",code=\"function_not_found\"} 1",
        "hapi_refused_total{tenant=\"bob\",endpoint=\"invoke\",code=\"function_not_found\"} 1",
        "hapi_refused_total{tenant=\"alice\",endpoint=\"undeploy\",code=\"function_not_found\"} 1",
        "hapi_refused_total{tenant=\"alice\",endpoint=\"undeploy\",code=\"function_managed_by_policy\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
    assert!(compile_seconds(&metrics, "alice", "ok") > 0.0, "{metrics}");
}

/// An upload of the bytes a function already has leaves it as it is: the same answer, and
/// its file not written again (each such upload rewrote and synced it under the lock every
/// tenant's commits wait for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_of_the_same_bytes_writes_nothing() {
    use std::os::unix::fs::MetadataExt;
    let h = TestHost::start().await;
    let file = h
        .policy_path
        .with_file_name("state")
        .join("functions/alice/mine.wasm");
    let sha = deploy_mine(&h).await;
    let inode = || std::fs::metadata(&file).expect("the function's file").ino();
    let before = inode();
    for _ in 0..3 {
        assert_eq!(deploy_mine(&h).await, sha);
        assert_eq!(inode(), before, "the file was written again");
    }
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "output", "bytes": "2"}});
    assert_eq!(raw(h.invoke(ALICE, "mine", body).await).await, [7, 7]);
    // Other bytes under the name are written.
    assert_eq!(
        h.put_function(ALICE, "mine", variant("hostile", "mine-2"))
            .await
            .status(),
        201
    );
    assert_ne!(inode(), before);
}

/// A tenant's functions of the same bytes share one compiled image in memory, as the quota
/// counts it once: each had been deserialized into an image of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_of_the_same_bytes_share_their_compiled_code() {
    let h = TestHost::start().await;
    for name in ["mine", "mine2"] {
        let resp = h
            .put_function(ALICE, name, variant("hostile", "mine"))
            .await;
        assert_eq!(resp.status(), 201, "{name}");
    }
    let image = |name: &str| {
        let f = h.host.function("alice", name).expect("deployed");
        let range = f.prepared.component().image_range();
        (range.start.addr(), range.end.addr())
    };
    let first = image("mine");
    assert_eq!(image("mine2"), first, "one image for both");
    // Deployed again under its own name: still the same image.
    let resp = h
        .put_function(ALICE, "mine", variant("hostile", "mine"))
        .await;
    assert_eq!(resp.status(), 201);
    assert_eq!(image("mine"), first);
    // Other bytes: another image.
    let resp = h
        .put_function(ALICE, "other", variant("hostile", "other"))
        .await;
    assert_eq!(resp.status(), 201);
    assert_ne!(image("other"), first);
    // A restart loads both from the state directory: one image again.
    let policy = Policy::load(&h.policy_path).expect("policy");
    let again = tokio::task::spawn_blocking(move || Host::start(policy))
        .await
        .expect("join")
        .expect("restarted");
    let image = |name: &str| {
        let f = again.function("alice", name).expect("loaded");
        let range = f.prepared.component().image_range();
        (range.start.addr(), range.end.addr())
    };
    assert_eq!(image("mine"), image("mine2"), "one image after a restart");
}

/// A function deployed with the bytes of a loaded one shares its compiled code and writes no
/// file of it; if the file went meanwhile (a removal of the loaded function while the upload
/// was being checked: removals wait for the table, builds do not), it is written again when the
/// upload is entered, so a restart does not compile it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_shares_compiled_code_keeps_its_file() {
    let h = TestHost::start().await;
    let compiled = h
        .policy_path
        .with_file_name("state")
        .join("compiled")
        .join("alice");
    let files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&compiled)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let resp = h
        .put_function(ALICE, "mine", variant("hostile", "mine"))
        .await;
    assert_eq!(resp.status(), 201);
    let sha = h
        .host
        .function("alice", "mine")
        .expect("deployed")
        .sha256
        .clone();
    let kept = files();
    let mine = kept
        .iter()
        .find(|f| f.starts_with(&sha))
        .unwrap_or_else(|| panic!("no file of {sha} in {kept:?}"));
    // What the racing removal did.
    std::fs::remove_file(compiled.join(mine)).expect("remove");
    assert_ne!(files(), kept);
    let resp = h
        .put_function(ALICE, "mine2", variant("hostile", "mine"))
        .await;
    assert_eq!(resp.status(), 201);
    assert_eq!(files(), kept, "the compiled code's file is back");
}

/// A removal whose file cannot be removed is an error, and the function stays: the removal
/// answered 204 and the file brought the function back at the next reload or start. (Its file
/// is made a directory here, which `unlink` refuses; the host runs as any user, and root
/// ignores a read-only directory.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_that_cannot_remove_the_file_is_an_error_and_removes_nothing() {
    let h = TestHost::start().await;
    let resp = h
        .put_function(ALICE, "mine", variant("hostile", "mine"))
        .await;
    assert_eq!(resp.status(), 201);
    let file = h
        .policy_path
        .with_file_name("state")
        .join("functions/alice/mine.wasm");
    let saved = std::fs::read(&file).expect("the upload's file");
    std::fs::remove_file(&file).expect("remove");
    std::fs::create_dir_all(file.join("in-the-way")).expect("a directory in its place");
    let (code, message) = error_code(h.delete_function(ALICE, "mine").await, 500).await;
    assert_eq!(code, "host_fault", "{message}");
    assert!(list(&h, ALICE).await.iter().any(|f| f["name"] == "mine"));
    std::fs::remove_dir_all(&file).expect("clear");
    std::fs::write(&file, saved).expect("put it back");
    assert_eq!(h.delete_function(ALICE, "mine").await.status(), 204);
    assert!(list(&h, ALICE).await.iter().all(|f| f["name"] != "mine"));
    assert!(!file.exists());
}

/// A trap's message names the guest's frames as its name section does, never demangled: a
/// C++ mangled name whose substitutions refer back to earlier ones demangles to text that
/// grows eightfold per level (this 150-byte one to 508 KB, a 300-byte one to gigabytes), built
/// whole on an invocation worker, in no account and past any time limit, before the message was
/// cut to its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_frames_name_is_not_demangled() {
    let h = TestHost::start().await;
    let mut name = "_Z1f1AIiiE".to_string();
    for k in 0..5 {
        name.push_str(&format!("S_I{}E", format!("S{k}_").repeat(8)));
    }
    assert_eq!(name.len(), 150);
    let body = instantiating("hostile", &trapping_named(&name), 1);
    assert_eq!(h.put_function(ALICE, "trap", body).await.status(), 201);
    let call = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0});
    let (code, message) = error_code(h.invoke(ALICE, "trap", call).await, 422).await;
    assert_eq!(code, "function_trapped", "{message}");
    assert!(message.contains(&name), "{message}");
}

/// Taking the deploy right away stops the tenant's uploads (an operator's answer to abuse;
/// the tenant cannot delete them without the right): they were loaded and served whatever the
/// right said. They stay on disk and come back with the right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_without_the_deploy_right_runs_none_of_its_uploads() {
    let h = TestHost::start().await;
    deploy_mine(&h).await;
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "output", "bytes": "3"}});
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    h.reload(&original.replacen("deploy = true", "deploy = false", 1))
        .await
        .expect("reloaded");
    let (code, message) = error_code(h.invoke(ALICE, "mine", body.clone()).await, 404).await;
    assert_eq!(code, "function_not_found", "{message}");
    assert!(
        list(&h, ALICE).await.iter().all(|f| f["name"] != "mine"),
        "not listed either"
    );
    // The policy's own functions still run.
    let hostile = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "output", "bytes": "2"}});
    assert_eq!(raw(h.invoke(ALICE, "hostile", hostile).await).await, [7, 7]);
    h.reload(&original).await.expect("reloaded");
    assert_eq!(raw(h.invoke(ALICE, "mine", body).await).await, [7, 7, 7]);
}

/// At start the host removes what no function can use from the state directory: compiled code
/// of another engine version, of a function no longer there or of a tenant no longer in the
/// policy, and files a crash left half written. The code of the functions it loads stays, and
/// they still run; a removed tenant's uploads stay too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_removes_compiled_code_that_no_function_uses() {
    let h = TestHost::start().await;
    let state = h.policy_path.with_file_name("state");
    let sha = deploy_mine(&h).await;
    let kept = files(&state.join("compiled/alice"));
    assert_eq!(
        kept.len(),
        3,
        "the policy's two functions and mine: {kept:?}"
    );
    let planted = [
        format!("compiled/alice/{sha}-0000000000000000.cwasm"),
        format!("compiled/alice/{}-0123456789abcdef.cwasm", "0".repeat(64)),
        format!("compiled/alice/{sha}-0123456789abcdef.cwasm.tmp"),
        "functions/alice/other.wasm.tmp".to_string(),
        // A tenant the policy no longer has: its code goes, its upload stays.
        "compiled/gone/code.cwasm".to_string(),
        "functions/gone/theirs.wasm".to_string(),
    ];
    for p in &planted {
        let p = state.join(p);
        std::fs::create_dir_all(p.parent().expect("a directory")).expect("mkdir");
        std::fs::write(p, b"left over").expect("plant");
    }
    let policy = Policy::load(&h.policy_path).expect("policy");
    let again = tokio::task::spawn_blocking(move || Host::start(policy))
        .await
        .expect("join")
        .expect("the host starts again");
    assert_eq!(files(&state.join("compiled/alice")), kept);
    assert_eq!(files(&state.join("functions/alice")), ["mine.wasm"]);
    assert!(!state.join("compiled/gone").exists());
    assert_eq!(files(&state.join("functions/gone")), ["theirs.wasm"]);
    let mine = again.functions("alice");
    assert!(
        mine.iter().any(|f| f.name == "mine" && f.sha256 == sha),
        "mine is loaded again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_names_and_nothing_outside_a_tenants_files_is_touched() {
    let h = TestHost::start().await;
    let state = h.policy_path.with_file_name("state");
    assert_eq!(
        h.put_function(ALICE, "mine", wasm("hostile"))
            .await
            .status(),
        201
    );
    for name in [
        "..%2Fbob%2Ffeature-extract",
        "..%2F..%2Fpolicy.toml",
        "a%00b",
        "mine.wasm",
        "x%2Fy",
        &"a".repeat(65),
    ] {
        let (code, message) = error_code(h.delete_function(ALICE, name).await, 400).await;
        assert_eq!(code, "bad_name", "{name}: {message}");
        let (code, _) = error_code(h.put_function(ALICE, name, wasm("hostile")).await, 400).await;
        assert_eq!(code, "bad_name", "{name}");
        let (code, _) = error_code(
            h.invoke(
                ALICE,
                name,
                json!({"bucket": "b", "keys": [], "model": "m", "split": 0}),
            )
            .await,
            400,
        )
        .await;
        assert_eq!(code, "bad_name", "{name}");
    }
    // The operator's functions cannot be replaced or removed through the API.
    let (code, _) = error_code(h.delete_function(ALICE, "feature-extract").await, 409).await;
    assert_eq!(code, "function_managed_by_policy");
    let (code, _) = error_code(h.put_function(ALICE, "hostile", wasm("hostile")).await, 409).await;
    assert_eq!(code, "function_managed_by_policy");
    // Everything is where it was; the host starts again from the same state.
    assert_eq!(files(&state.join("functions/alice")), ["mine.wasm"]);
    let policy = Policy::load(&h.policy_path).expect("policy");
    let again = tokio::task::spawn_blocking(move || Host::start(policy))
        .await
        .expect("join")
        .expect("the host starts again");
    assert!(again.function("alice", "mine").is_some());
    assert!(again.function("bob", "feature-extract").is_some());
}

/// Past its `compile_burst`, a tenant's uploads use at most its `compile_share` of one compile
/// thread: its next upload is refused (429 `deploy_busy`, counted as refused) until the compile
/// time is paid back, and another tenant's uploads are not held back by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_uploads_are_held_to_its_share_of_the_compiler() {
    let h = start_tenants(|store, state| {
        common::tenants_policy(store, state, "", 2, &["resnet18"], |t| match t {
            0 => "deploy = true\ncompile_share = 100\ncompile_burst = \"1ms\"".into(),
            _ => "deploy = true".into(),
        })
    })
    .await;
    let (t0, t1) = (tenant_token(0), tenant_token(1));
    async fn put(h: &TestHost, token: &str, name: &str, tag: &str) -> reqwest::Response {
        h.put_function(token, name, variant("hostile", tag)).await
    }
    assert_eq!(put(&h, &t0, "a", "a").await.status(), 201);
    // Its compile took longer than the burst: owed until as long again has passed (100%).
    let (code, message) = error_code(put(&h, &t0, "b", "b").await, 429).await;
    assert_eq!(code, "deploy_busy", "{message}");
    assert!(
        message.contains("compile time") && message.contains("retry in"),
        "{message}"
    );
    assert_eq!(
        put(&h, &t1, "b", "b").await.status(),
        201,
        "t1 is not held back"
    );
    let until = Instant::now() + Duration::from_secs(60);
    let mut refused = 1;
    loop {
        let resp = put(&h, &t0, "b", "b").await;
        if resp.status() == 201 {
            break;
        }
        let (code, message) = error_code(resp, 429).await;
        assert_eq!(code, "deploy_busy", "{message}");
        refused += 1;
        assert!(Instant::now() < until, "not taken again within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = h.metrics().await;
    for line in [
        format!(
            "hapi_refused_total{{tenant=\"t0\",endpoint=\"deploy\",code=\"deploy_busy\"}} {refused}"
        ),
        "hapi_uploads_total{tenant=\"t0\",code=\"ok\"} 2".to_string(),
        "hapi_uploads_total{tenant=\"t1\",code=\"ok\"} 1".to_string(),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_quotas_obeyed_and_violated() {
    // t0 may keep 2 functions; t1 any number, of 5 MiB in all until the test lowers it.
    let h = start_tenants(|store, state| {
        common::tenants_policy(store, state, "", 2, &["resnet18"], |t| match t {
            0 => "deploy = true\nmax_functions = 2\nmax_function_bytes = \"4MiB\"".into(),
            _ => "deploy = true\nmax_function_bytes = \"5MiB\"".into(),
        })
    })
    .await;
    let hostile = |tag: &str| variant("hostile", tag);
    assert!(
        hostile("x").len() < 128 << 10,
        "hostile is {} bytes",
        hostile("x").len()
    );
    let t0 = tenant_token(0);
    assert_eq!(h.put_function(&t0, "a", hostile("a")).await.status(), 201);
    assert_eq!(h.put_function(&t0, "b", hostile("b")).await.status(), 201);
    // Replacing one of them stays within the count.
    assert_eq!(h.put_function(&t0, "b", hostile("b2")).await.status(), 201);
    let (code, message) = error_code(h.put_function(&t0, "c", hostile("c")).await, 403).await;
    assert_eq!(code, "quota_exceeded", "{message}");
    assert!(message.contains("may keep 2"), "{message}");
    assert_eq!(h.delete_function(&t0, "b").await.status(), 204);
    assert_eq!(h.put_function(&t0, "c", hostile("c")).await.status(), 201);

    // Bytes count the compiled code the host keeps beside the Wasm. With room for two uploads'
    // Wasm and one and a half of their code, a second different upload is refused, the same
    // bytes under a second name (sharing the first's code) are not.
    let t1 = tenant_token(1);
    assert_eq!(h.put_function(&t1, "a", hostile("a")).await.status(), 201);
    let listed = list(&h, &t1).await;
    let a = &listed[0];
    let (wasm, code) = (
        a["size"].as_u64().expect("size"),
        a["compiled_size"].as_u64().expect("compiled_size"),
    );
    eprintln!("hostile: {wasm} bytes of Wasm, {code} bytes of compiled code");
    assert!(code > wasm / 2, "{a}");
    let quota = 2 * wasm + code + code / 2;
    let policy = std::fs::read_to_string(&h.policy_path).expect("policy");
    let lowered = policy.replacen(
        "max_function_bytes = \"5MiB\"",
        &format!("max_function_bytes = \"{quota}B\""),
        1,
    );
    h.reload(&lowered).await.expect("reloaded");
    let (code_, message) = error_code(h.put_function(&t1, "b", hostile("b")).await, 403).await;
    assert_eq!(code_, "quota_exceeded", "{message}");
    assert!(
        message.contains(&format!("of compiled code); its quota is {quota}")),
        "{message}"
    );
    assert_eq!(h.put_function(&t1, "a2", hostile("a")).await.status(), 201);
    let names: Vec<String> = list(&h, &t1)
        .await
        .iter()
        .map(|f| f["name"].as_str().expect("name").to_string())
        .collect();
    assert_eq!(names, ["a", "a2"]);
    // One larger than the quota is not even read.
    let too_big = vec![0u8; usize::try_from(quota).expect("quota") + 1];
    let (code_, message) = error_code(h.put_function(&t1, "d", too_big).await, 413).await;
    assert_eq!(code_, "body_too_large", "{message}");
}

/// An upload replaced while a call runs on it keeps its compiled code in memory until the call
/// ends, and that code counts against the quota until then, a reload between included: with a
/// slot per version, a tenant kept one copy of its largest upload in memory per slot, all but
/// one outside the quota (and one more per reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_code_that_calls_still_run_on_counts_against_the_quota() {
    let h = start_tenants(|store, state| {
        common::tenants_policy(store, state, "", 1, &["resnet18"], |_| {
            "deploy = true\nmax_function_bytes = \"5MiB\"".into()
        })
        .replacen("timeout = \"120s\"", "timeout = \"15s\"", 1)
    })
    .await;
    let t0 = tenant_token(0);
    let hostile = |tag: &str| variant("hostile", tag);
    assert_eq!(
        h.put_function(&t0, "mine", hostile("v1")).await.status(),
        201
    );
    let listed = list(&h, &t0).await;
    let (wasm, code) = (
        listed[0]["size"].as_u64().expect("size"),
        listed[0]["compiled_size"].as_u64().expect("compiled_size"),
    );
    // Room for one upload and half another's code.
    let quota = wasm + code + code / 2;
    let policy = std::fs::read_to_string(&h.policy_path).expect("policy");
    let policy = policy.replacen(
        "max_function_bytes = \"5MiB\"",
        &format!("max_function_bytes = \"{quota}B\""),
        1,
    );
    h.reload(&policy).await.expect("reloaded");
    let t = h.host.policy().tenants["t0"].clone();
    let admission = h.host.admission(&t);
    let image_of_v1 = h
        .host
        .function("t0", "mine")
        .expect("deployed")
        .prepared
        .component()
        .image_range();
    let (client, url, token) = (h.client.clone(), h.url.clone(), t0.clone());
    let running = tokio::spawn(async move {
        let body = common::hostile("loop", &[], &[]);
        common::invoke_at(&client, &url, &token, "mine", body).await
    });
    let until = Instant::now() + Duration::from_secs(30);
    while admission.load() != (1, 0) {
        assert!(Instant::now() < until, "{:?}", admission.load());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A reload meanwhile (the same policy) keeps v1 as the call holds it: it had put a new
    // copy in the table, and the one the call ran on was counted by nobody once replaced.
    h.reload(&policy).await.expect("reloaded");
    // v1 runs: replacing it is within the quota (v1 is not counted as the table's)...
    assert_eq!(
        h.put_function(&t0, "mine", hostile("v2")).await.status(),
        201
    );
    // ...but its code, still in memory, counts beside a third version's.
    let (code_, message) = error_code(h.put_function(&t0, "mine", hostile("v3")).await, 403).await;
    assert_eq!(code_, "quota_exceeded", "{message}");
    assert!(
        message.contains("the code of 1 replaced or removed uploads included"),
        "{message}"
    );
    // v1's bytes uploaded again (under another name, v2 removed first) share the image the
    // call runs on, as the quota counts them: once. They were compiled into a second image
    // beside it, and a tenant held one more copy per call it kept running.
    assert_eq!(h.delete_function(&t0, "mine").await.status(), 204);
    assert_eq!(
        h.put_function(&t0, "again", hostile("v1")).await.status(),
        201
    );
    let again = h.host.function("t0", "again").expect("deployed");
    assert_eq!(
        again.prepared.component().image_range(),
        image_of_v1,
        "v1's bytes were loaded again, in an image of their own"
    );
    drop(again);
    assert_eq!(h.delete_function(&t0, "again").await.status(), 204);
    // Once the call on v1 ends, its code is gone, and v3 fits.
    let (code_, message) = error_code(running.await.expect("join"), 422).await;
    assert_eq!(code_, "time_limit_exceeded", "{message}");
    assert_eq!(
        h.put_function(&t0, "mine", hostile("v3")).await.status(),
        201
    );
}

/// The tenant's uploaded functions as the API lists them, by name.
async fn list(h: &TestHost, token: &str) -> Vec<serde_json::Value> {
    let mut v: Vec<serde_json::Value> = h
        .client
        .get(format!("{}/v1/functions", h.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("a list");
    v.retain(|f| f["managed"] == false);
    v.sort_by_key(|f| f["name"].as_str().unwrap_or_default().to_string());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_code_is_kept_per_tenant() {
    let h = start_tenants(|store, state| {
        common::tenants_policy(store, state, "", 2, &["resnet18"], |_| {
            "deploy = true".into()
        })
    })
    .await;
    let state = h.policy_path.with_file_name("state");
    let bytes = variant("hostile", "shared");
    assert_eq!(
        h.put_function(&tenant_token(0), "a", bytes.clone())
            .await
            .status(),
        201
    );
    assert_eq!(
        h.put_function(&tenant_token(1), "a", bytes).await.status(),
        201
    );
    // The same bytes, compiled for each tenant and cached apart: one tenant's upload tells
    // another nothing (its own compile takes as long as the first).
    let mine = files(&state.join("compiled/t0"));
    let theirs = files(&state.join("compiled/t1"));
    assert!(!mine.is_empty() && mine == theirs, "{mine:?} {theirs:?}");
    assert_eq!(h.delete_function(&tenant_token(0), "a").await.status(), 204);
    assert_eq!(files(&state.join("compiled/t1")), theirs, "t1's code stays");
}

/// Every bound of the pre-compile check, obeyed and violated, on components built to sit just
/// within and just past it.
#[test]
fn the_code_bounds_are_checked_before_compiling() {
    let allowed = hapi_host::wasm::invoke::allowed_imports(Default::default());
    let check = |bytes: &[u8]| compile::check(bytes, "t", &allowed);
    let too = |r: Result<compile::Checked, DeployError>, needle: &str| match r {
        Err(DeployError::TooComplex(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("{needle}: {other:?}"),
    };
    // The largest body.
    let body = compile::MAX_FUNCTION_BODY;
    let ok = check(&guest_with("hostile", &[module(1, body - 16)])).expect("within");
    assert!(ok.largest_body <= body);
    too(
        check(&guest_with("hostile", &[module(1, body + 16)])),
        "a function body of",
    );
    // All code together: 16 bodies just under the body bound are over 8 MiB.
    let per = compile::MAX_CODE_BYTES / 16;
    check(&guest_with("hostile", &[module(15, per)])).expect("15/16 of the code bound");
    too(
        check(&guest_with("hostile", &[module(17, per)])),
        "bytes of code",
    );
    // Functions.
    let n = compile::MAX_FUNCTIONS - 2_000;
    check(&guest_with("hostile", &[module(n, 8)])).expect("within the function bound");
    too(
        check(&guest_with(
            "hostile",
            &[module(compile::MAX_FUNCTIONS + 1, 8)],
        )),
        "functions",
    );
    // Modules.
    let small = module(1, 8);
    let room = compile::MAX_MODULES - check(&wasm("hostile")).expect("hostile").modules;
    check(&guest_with("hostile", &vec![small.clone(); room])).expect("within the module bound");
    too(
        check(&guest_with(
            "hostile",
            &vec![small; compile::MAX_MODULES + 1],
        )),
        "modules",
    );
    // Memories and tables, all modules' together (wasmtime prepares their images when it
    // compiles, instantiated or not), and a table's start size.
    let (memories, tables) = memories_and_tables(&wasm("hostile"));
    let (max_memories, max_tables) = (compile::MAX_MEMORIES as usize, compile::MAX_TABLES as usize);
    let spare = max_memories - memories as usize;
    check(&guest_with("hostile", &[defining_many(spare, 0, 0)])).expect("within the memories");
    too(
        check(&guest_with("hostile", &[defining_many(spare + 1, 0, 0)])),
        "memories defined by its modules",
    );
    let spare = max_tables - tables as usize;
    check(&guest_with("hostile", &[defining_many(0, spare, 0)])).expect("within the tables");
    too(
        check(&guest_with("hostile", &[defining_many(0, spare + 1, 0)])),
        "tables defined by its modules",
    );
    let elements = hapi_host::wasm::engine::MAX_TABLE_ELEMENTS;
    check(&guest_with("hostile", &[defining_many(0, 1, elements)])).expect("a table at its bound");
    too(
        check(&guest_with("hostile", &[defining_many(0, 1, elements + 1)])),
        "a table of 20001 elements at its start",
    );
    // Imports, the component's and its modules' together, counted before the validator
    // builds its tables for them.
    let spare = (compile::MAX_IMPORTS - imports_of(&wasm("hostile"))) as usize;
    check(&guest_with("hostile", &[importing(spare)])).expect("within the imports");
    too(
        check(&guest_with("hostile", &[importing(spare + 1)])),
        "more than 10000 imports",
    );
    // Items of every section together (here types), counted before the validator builds its
    // tables for them.
    check(&guest_with("hostile", &[typing(100_000)])).expect("within the items");
    too(
        check(&guest_with(
            "hostile",
            &[typing(compile::MAX_ITEMS as usize)],
        )),
        "items (types, imports, functions, exports...)",
    );
    // Declarations inside a type (here an instance type's), counted with the items.
    check(&declaring("hostile", 100_000)).expect("within the items");
    too(
        check(&declaring("hostile", compile::MAX_ITEMS as usize)),
        "items (types, imports, functions, exports...)",
    );
    // Nested components (a composition), whatever they do: wasmtime's compile inlines every
    // instantiation of them anew (four levels of 999 were 10^12 instances from 12 KB); and a
    // component it imports, instantiated, could be any its instantiator passes in.
    for (what, bytes) in [
        ("one nested", instantiating_nested("hostile", 1, 1)),
        ("999^4", instantiating_nested("hostile", 4, 999)),
        ("types", instantiating_types("hostile", 10, 1)),
        ("an import", instantiating_an_import("hostile")),
    ] {
        match check(&bytes) {
            Err(DeployError::TooComplex(m)) => {
                assert!(m.contains("it nests components"), "{what}: {m}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // An instance of exports that exports an instance: each use of it copies all it holds.
    too(
        check(&exporting_an_instance("hostile")),
        "exports an instance or a component",
    );
    // Types nested in types, which the parser reads by recursion: a million levels (3 MB)
    // overflowed the stack, which aborted the host.
    let deepest = compile::MAX_TYPE_DEPTH;
    check(&nesting_types("hostile", deepest)).expect("within the nesting");
    for depth in [deepest + 1, 1_000_000] {
        too(
            check(&nesting_types("hostile", depth)),
            "component or instance types nested more than 32 deep",
        );
    }
    // The GC proposal's recursion groups: a million types in one item of a type section.
    match check(&guest_with("hostile", &[rec_typing(200_000)])) {
        Err(DeployError::Invalid(m)) => assert!(m.contains("gc"), "{m}"),
        other => panic!("a recursion group: {other:?}"),
    }
    // Function names (wasmtime copies them into every trap's backtrace).
    let name = compile::MAX_FUNCTION_NAME;
    for (function, needle) in [
        (true, "function 0 is named in 4097 bytes"),
        (false, "a module is named in 4097 bytes"),
    ] {
        check(&guest_with(
            "hostile",
            &[named(module(1, 8), name, function)],
        ))
        .expect("within the name bound");
        too(
            check(&guest_with(
                "hostile",
                &[named(module(1, 8), name + 1, function)],
            )),
            needle,
        );
    }
    // Strings other than UTF-8 (which the host would lift into up to twice their bytes).
    for (encoding, needle) in [(1, "UTF-16"), (2, "Latin-1")] {
        match check(&string_encoding("hostile", encoding)) {
            Err(DeployError::Invalid(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{needle}: {other:?}"),
        }
    }
    // So are the real guests' names: two the suite builds itself whose imports a tenant is
    // granted by default (`image-stats`, which only the template test builds, was read from an
    // earlier run's build, and failed on a new machine).
    for guest in ["feature-extract", "hostile"] {
        check(&wasm(guest)).unwrap_or_else(|e| panic!("{guest}: {e}"));
    }
}

/// The compile queue, all tenants together (`MAX_COMPILE_QUEUE`): uploads past it are answered
/// 429 `deploy_busy` at once, the rest are compiled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_compile_queue_is_bounded() {
    let max = hapi_host::functions::MAX_COMPILE_QUEUE;
    let tenants = max + 4;
    let h = start_tenants(|store, state| {
        common::tenants_policy(store, state, "", tenants, &["resnet18"], |_| {
            "deploy = true".into()
        })
    })
    .await;
    // Each upload takes a while to compile: all arrive while the first are still compiling.
    let bytes = guest_with("hostile", &[module(4, 250_000)]);
    let uploads = (0..tenants).map(|t| {
        let (h, bytes) = (&h, bytes.clone());
        async move {
            h.put_function(&tenant_token(t), "big", bytes)
                .await
                .status()
                .as_u16()
        }
    });
    let statuses = futures::future::join_all(uploads).await;
    let created = statuses.iter().filter(|&&s| s == 201).count();
    let busy = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(created + busy, tenants, "{statuses:?}");
    assert!(busy >= 1 && created >= max, "{statuses:?}");
}

/// An upload whose client hangs up while it compiles keeps its place in the compile queue until
/// its compile ends (a compile cannot be stopped once it runs): hanging up and uploading again
/// cannot run more compiles than the queue's bounds allow. The upload is still deployed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_client_hangs_up_keeps_its_place_until_its_compile_ends() {
    use tokio::io::AsyncWriteExt;
    let h = TestHost::start().await;
    // Seconds of compiling on this machine.
    let bytes = guest_with("hostile", &[module(16, 400_000)]);
    let addr = h.url.trim_start_matches("http://").to_string();
    let head = format!(
        "PUT /v1/functions/big HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: {}\r\n\r\n",
        bytes.len()
    );
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    conn.write_all(head.as_bytes()).await.expect("head");
    conn.write_all(&bytes).await.expect("body");
    until_compiling(&h).await;
    drop(conn);
    // Until the function is deployed, its compile holds its place.
    let deployed = || h.host.functions("alice").iter().any(|f| f.name == "big");
    let until = Instant::now() + Duration::from_secs(300);
    let mut held = 0;
    loop {
        // The queue first: the compile is in the table before it leaves the queue, so a
        // queue found empty means the function must be deployed by then.
        if h.host.uploads_compiling() == 0 {
            assert!(
                deployed(),
                "the upload left the queue while it compiled ({held} checks in)"
            );
            break;
        }
        assert!(Instant::now() < until, "not deployed within 300 s");
        held += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        held > 0,
        "compiled before the client hung up: the test needs a larger upload"
    );
}

/// Code that compiles but does not implement the world (here, an import of an interface the
/// host does not have, `hapi:pushdown/objectz`, which passes the import check by its prefix)
/// is refused, and its compiled code is not kept: nothing would ever remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_does_not_implement_the_world_is_not_kept() {
    let h = TestHost::start().await;
    let state = h.policy_path.with_file_name("state");
    let bytes = std::fs::read(guest("hostile")).expect("guest");
    let (from, to) = (b"hapi:pushdown/objects", b"hapi:pushdown/objectz");
    let mut renamed = bytes.clone();
    let mut replaced = 0;
    for i in 0..=renamed.len() - from.len() {
        if &renamed[i..i + from.len()] == from {
            renamed[i..i + to.len()].copy_from_slice(to);
            replaced += 1;
        }
    }
    assert!(replaced > 0, "the guest imports hapi:pushdown/objects");
    // The code of the policy's own functions.
    let before = files(&state.join("compiled/alice"));
    let (code, message) = error_code(h.put_function(ALICE, "odd", renamed).await, 422).await;
    assert_eq!(code, "bad_component", "{message}");
    assert!(message.contains("objectz"), "{message}");
    assert_eq!(files(&state.join("compiled/alice")), before);
    assert!(files(&state.join("functions/alice")).is_empty());
}

/// A component built against another version of the `hapi:pushdown` world (here, the hostile
/// guest with its imports renamed to 0.1.0) is refused before it is compiled, with the version
/// it was built for and the one the host implements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_against_another_world_version_is_told_to_rebuild() {
    use hapi_host::wasm::compile::WORLD_VERSION;
    let h = TestHost::start().await;
    let mut bytes = std::fs::read(guest("hostile")).expect("guest");
    let mut replaced = 0;
    for iface in ["objects", "models", "types"] {
        let from = format!("hapi:pushdown/{iface}@{WORLD_VERSION}").into_bytes();
        let to = format!("hapi:pushdown/{iface}@0.1.0").into_bytes();
        assert_eq!(from.len(), to.len());
        for i in 0..=bytes.len() - from.len() {
            if bytes[i..i + from.len()] == from[..] {
                bytes[i..i + to.len()].copy_from_slice(&to);
                replaced += 1;
            }
        }
    }
    assert!(
        replaced > 0,
        "the guest imports hapi:pushdown@{WORLD_VERSION}"
    );
    let (code, message) = error_code(h.put_function(ALICE, "old", bytes).await, 422).await;
    assert_eq!(code, "bad_component", "{message}");
    assert!(
        message.contains("built against hapi:pushdown@0.1.0")
            && message.contains(&format!("implements hapi:pushdown@{WORLD_VERSION}"))
            && message.contains("rebuild"),
        "{message}"
    );
    // The host's own functions still deploy and run.
    let resp = h
        .put_function(
            ALICE,
            "current",
            std::fs::read(guest("hostile")).expect("guest"),
        )
        .await;
    assert!(resp.status().is_success(), "{}", resp.status());
}

/// A tenant's upload is reserved before its bytes are read: while one upload of alice's is in
/// progress (here, its 1 MB body not sent yet), another is refused at once (429
/// `deploy_busy`), so a tenant holds at most one upload's bytes whatever number of connections
/// it opens. When that connection goes away, alice may upload again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_has_one_upload_in_progress_from_before_its_bytes_are_read() {
    use tokio::io::AsyncWriteExt;
    let h = TestHost::start().await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "PUT /v1/functions/slow HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: 1000000\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = h
            .put_function(ALICE, "other", variant("hostile", "other"))
            .await;
        if resp.status() == 429 {
            let (code, message) = error_code(resp, 429).await;
            assert_eq!(code, "deploy_busy", "{message}");
            assert!(message.contains("upload in progress"), "{message}");
            break;
        }
        // Deployed before the slow upload was reserved: remove it and look again.
        assert_eq!(resp.status(), 201);
        assert!(Instant::now() < until, "the slow upload was never reserved");
        assert_eq!(h.delete_function(ALICE, "other").await.status(), 204);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(conn);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let status = h
            .put_function(ALICE, "other", variant("hostile", "other"))
            .await
            .status();
        if status == 201 {
            break;
        }
        assert_eq!(status, 429);
        assert!(
            Instant::now() < until,
            "the reservation outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A policy reload while an upload compiles holds the upload to the new policy: a tenant that
/// may no longer deploy gets nothing deployed, and a name the operator's policy now manages
/// stays the operator's. Neither upload leaves its file behind. (Before, the upload was entered
/// in the table the reload had just built, whatever the new policy said.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_compiles_across_a_reload_is_held_to_the_new_policy() {
    let h = TestHost::start().await;
    let state = h.policy_path.with_file_name("state");
    let (uploads, compiled) = (state.join("functions/alice"), state.join("compiled/alice"));
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    // Seconds of compiling on this machine.
    let bytes = guest_with("hostile", &[module(16, 400_000)]);
    let managed = format!(
        "[tenants.alice.functions]\nbig = \"{}\"\n",
        guest("hostile").display()
    );
    let cases = [
        (
            original.replacen("deploy = true", "deploy = false", 1),
            403,
            "deploy_not_allowed",
            "reloaded while function `big` compiled",
        ),
        (
            original.replacen("[tenants.alice.functions]\n", &managed, 1),
            409,
            "function_managed_by_policy",
            "deployed by the operator's policy",
        ),
        (
            // The token rotated (a leaked one, say): the upload it sent is not deployed.
            original.replacen(&hash_token(ALICE), &hash_token("alice-rotated"), 1),
            401,
            "bad_token",
            "its token no longer belongs to tenant `alice`",
        ),
    ];
    for (changed, status, expected, says) in cases {
        h.reload(&original).await.expect("reloaded");
        let code_before = files(&compiled);
        let put = {
            let (client, url, body) = (h.client.clone(), h.url.clone(), bytes.clone());
            tokio::spawn(async move {
                client
                    .put(format!("{url}/v1/functions/big"))
                    .bearer_auth(ALICE)
                    .body(body)
                    .send()
                    .await
                    .expect("request")
            })
        };
        until_compiling(&h).await;
        h.reload(&changed).await.expect("reloaded");
        assert!(
            h.host.uploads_compiling() > 0,
            "compiled before the reload: the test needs a larger upload"
        );
        let (code, message) = error_code(put.await.expect("join"), status).await;
        assert_eq!(code, expected, "{message}");
        assert!(message.contains(says), "{message}");
        let big = h
            .host
            .functions("alice")
            .into_iter()
            .find(|f| f.name == "big");
        assert!(
            big.as_ref().is_none_or(|f| f.managed),
            "the upload was deployed: {message}"
        );
        assert!(
            !files(&uploads).contains(&"big.wasm".to_string()),
            "{:?}",
            files(&uploads)
        );
        assert_eq!(
            files(&compiled),
            code_before,
            "its compiled code is not kept"
        );
    }
}
