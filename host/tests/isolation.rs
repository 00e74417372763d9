//! Tenants reach only what they were granted; bad input of every kind gets a clear error.

mod common;

use common::{ALICE, BOB, TestHost, error_code, hostile, raw, sample_key};
use hapi_host::policy::hash_token;
use serde_json::json;

fn read(bucket: &str, keys: &[&str]) -> serde_json::Value {
    json!({"bucket": bucket, "keys": keys, "model": "resnet18", "split": 0, "options": {"mode": "read"}})
}

/// Alice reads an object of her grant: its 1,024 bytes.
async fn alice_reads_her_own(h: &TestHost) {
    let small = read("datasets", &["fashion-mnist/small.bin"]);
    assert_eq!(
        raw(h.invoke(ALICE, "hostile", small).await).await,
        vec![1u8; 1024]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_outside_the_grant_are_denied() {
    let h = TestHost::start().await;
    // Its own grant works...
    alice_reads_her_own(&h).await;
    // ...nothing else does.
    let cases: [(&str, &str); 8] = [
        ("secret", "bob/data.bin"),
        ("datasets", "private/notes.txt"),
        ("datasets", "../secret/bob/data.bin"),
        ("datasets", "fashion-mnist/../private/notes.txt"),
        ("datasets", "/etc/passwd"),
        ("datasets", "fashion-mnist//small.bin"),
        ("datasets", "fashion-mnist/./small.bin"),
        ("..", "etc/passwd"),
    ];
    for (bucket, key) in cases {
        let (code, message) =
            error_code(h.invoke(ALICE, "hostile", read(bucket, &[key])).await, 403).await;
        assert_eq!(code, "object_denied", "{bucket}/{key}: {message}");
    }
    // Bob cannot read Alice's objects either.
    let (code, _) = error_code(
        h.invoke(
            BOB,
            "hostile",
            read("datasets", &["fashion-mnist/small.bin"]),
        )
        .await,
        403,
    )
    .await;
    assert_eq!(code, "object_denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_shows_only_granted_keys() {
    let h = TestHost::start().await;
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "list", "prefix": "fashion-mnist/"}});
    let listed =
        String::from_utf8(raw(h.invoke(ALICE, "hostile", body).await).await).expect("utf-8");
    assert!(listed.lines().any(|k| k == sample_key(0)), "{listed}");
    assert!(
        listed.lines().all(|k| k.starts_with("fashion-mnist/")),
        "{listed}"
    );
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0, "options": {"mode": "list", "prefix": "private/"}});
    let (code, _) = error_code(h.invoke(ALICE, "hostile", body).await, 403).await;
    assert_eq!(code, "object_denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_corrupt_objects_are_named() {
    let h = TestHost::start().await;
    let fe = |keys: &[&str]| json!({"bucket": "datasets", "keys": keys, "model": "resnet18", "split": 2});
    let (code, message) = error_code(
        h.invoke(ALICE, "feature-extract", fe(&["fashion-mnist/nope.png"]))
            .await,
        404,
    )
    .await;
    assert_eq!(code, "object_not_found");
    assert!(message.contains("fashion-mnist/nope.png"), "{message}");
    let (code, message) = error_code(
        h.invoke(ALICE, "feature-extract", fe(&["fashion-mnist/corrupt.png"]))
            .await,
        422,
    )
    .await;
    assert_eq!(code, "bad_object");
    assert!(message.contains("fashion-mnist/corrupt.png"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_models_and_layer_ranges_are_rejected() {
    let h = TestHost::start().await;
    let fe = |model: &str, split: u32| json!({"bucket": "datasets", "keys": [sample_key(0)], "model": model, "split": split});
    for (model, split, needle) in [
        ("no_such_model", 1, "not one tenant `alice` may use"),
        ("vgg11", 1, "not one tenant `alice` may use"),
        ("resnet18", 16, "past the last layer"),
    ] {
        let (code, message) = error_code(
            h.invoke(ALICE, "feature-extract", fe(model, split)).await,
            400,
        )
        .await;
        assert_eq!(code, "bad_request", "{message}");
        assert!(message.contains(needle), "{model}[{split}]: {message}");
    }
    // Graph names straight through wasi-nn.
    let graph = |name: &str, dims: &str, bytes: usize| {
        json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0,
               "options": {"mode": "graph", "graph": name, "dims": dims, "bytes": bytes.to_string()}})
    };
    for (name, needle) in [
        ("resnet18[0..99]", "has 15 layers"),
        ("resnet18[3..3]", "empty layer range"),
        ("resnet18", "is not `<model>[a..b]`"),
        ("vgg11[0..1]", "not one tenant"),
        ("no_such[0..1]", "not one tenant"),
    ] {
        let (code, message) = error_code(
            h.invoke(ALICE, "hostile", graph(name, "1,3,224,224", 602_112))
                .await,
            422,
        )
        .await;
        assert_eq!(code, "inference_failed", "{message}");
        assert!(message.contains(needle), "{name}: {message}");
    }
    // The model's first load (and its measurement) may outlast a call's limit on a busy
    // machine: wait for it once, so that the answers below are about the tensors.
    let loaded = h
        .warm(
            ALICE,
            "hostile",
            graph("resnet18[0..2]", "1,3,224,224", 602_112),
        )
        .await;
    assert_eq!(loaded.status(), 200);
    // Tensors whose bytes or shape do not match.
    let (_, message) = error_code(
        h.invoke(
            ALICE,
            "hostile",
            graph("resnet18[0..2]", "1,3,224,224", 100),
        )
        .await,
        422,
    )
    .await;
    assert!(message.contains("tensor data is 100 bytes"), "{message}");
    let (_, message) = error_code(
        h.invoke(
            ALICE,
            "hostile",
            graph("resnet18[0..2]", "1,3,32,32", 12_288),
        )
        .await,
        422,
    )
    .await;
    assert!(
        message.contains("takes (batch >= 1, [3, 224, 224])"),
        "{message}"
    );
    let (_, message) = error_code(
        h.invoke(
            ALICE,
            "hostile",
            graph("resnet18[4..6]", "2,3,224,224", 1_204_224),
        )
        .await,
        422,
    )
    .await;
    assert!(message.contains("[64, 56, 56]"), "{message}");
    // And a valid call through the same path works.
    assert_eq!(
        raw(h
            .invoke(
                ALICE,
                "hostile",
                graph("resnet18[0..2]", "1,3,224,224", 602_112)
            )
            .await)
        .await,
        1u32.to_le_bytes()
    ); // usize is 32-bit in the guest
}

/// The two ways a reload takes alice's reads away, with what a call then gets (status, code,
/// and a part of its message): her first grant (hers comes first) names another prefix, or
/// her token changes.
fn revocations(original: &str) -> [(String, u16, &'static str, &'static str); 2] {
    let grant = r#"grants = [{ bucket = "datasets", prefix = "fashion-mnist/" }]"#;
    assert!(original.contains(grant), "alice's grant");
    [
        (
            original.replacen(
                grant,
                r#"grants = [{ bucket = "datasets", prefix = "private/" }]"#,
                1,
            ),
            403,
            "object_denied",
            "outside tenant `alice`'s grants",
        ),
        (
            original.replacen(&hash_token(ALICE), &hash_token("alice-new-token"), 1),
            401,
            "bad_token",
            "tenant `alice`",
        ),
    ]
}

/// Waits (30 s at most) until alice's calls, (running, waiting), are `want`; `what` names the
/// state in the failure.
async fn reach(
    admission: &std::sync::Arc<hapi_host::admission::Admission>,
    want: (usize, usize),
    what: &str,
) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while admission.load() != want {
        let now = admission.load();
        assert!(
            std::time::Instant::now() < until,
            "{what}: alice's calls (running, waiting) are {now:?}, not {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A reload reaches calls that were admitted to the queue before it but have not run: they
/// run under the new grants, or not at all once their token is revoked (they ran under the
/// policy they authenticated with, reading what the new one takes away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reaches_calls_still_waiting_for_their_slot() {
    let h = common::start_tenants(|store, state| {
        common::policy_text(store, state)
            .replacen(
                "deploy = true",
                "deploy = true\nconcurrency = 1\nqueue = 4",
                1,
            )
            .replacen("timeout = \"20s\"", "timeout = \"4s\"", 1)
    })
    .await;
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    let small = || read("datasets", &["fashion-mnist/small.bin"]);
    for (changed, status, expected, _) in revocations(&original) {
        h.reload(&original).await.expect("reloaded");
        assert_eq!(
            raw(h.invoke(ALICE, "hostile", small()).await).await,
            vec![1u8; 1024]
        );
        let alice = h.host.policy().tenants["alice"].clone();
        let admission = h.host.admission(&alice);
        let spawn = |body: serde_json::Value| {
            let (client, url) = (h.client.clone(), h.url.clone());
            tokio::spawn(
                async move { common::invoke_at(&client, &url, ALICE, "hostile", body).await },
            )
        };
        // The answer above holds its slot until its last byte is written, a moment after the
        // client has it.
        reach(&admission, (0, 0), "the first read's slot given back").await;
        // One call holds alice's only slot until her time limit; two wait behind it.
        let holding = spawn(hostile("loop", &[], &[]));
        reach(&admission, (1, 0), "the holding call running").await;
        let waiting = [spawn(small()), spawn(small())];
        reach(&admission, (1, 2), "two reads waiting behind it").await;
        h.reload(&changed).await.expect("reloaded");
        assert_eq!(admission.load(), (1, 2), "reloaded while they waited");
        for call in waiting {
            let (code, message) = error_code(call.await.expect("join"), status).await;
            assert_eq!(code, expected, "{message}");
        }
        let (code, message) = error_code(holding.await.expect("join"), 422).await;
        assert_eq!(code, "time_limit_exceeded", "{message}");
    }
}

/// `text` with a function of alice's that does not build, for a reload that fails.
fn with_a_broken_function(h: &TestHost, text: &str) -> String {
    let broken = h.policy_path.with_file_name("broken.wasm");
    std::fs::write(&broken, b"not a component").expect("write");
    let line = format!("broken = \"{}\"\n", broken.display());
    text.replacen(
        "[tenants.alice.functions]\n",
        &format!("[tenants.alice.functions]\n{line}"),
        1,
    )
}

/// The error, in full, of a reload of `text` that fails on alice's broken function.
async fn failed_reload(h: &TestHost, text: &str) -> String {
    let e = h
        .reload(text)
        .await
        .expect_err("alice's new function does not build");
    format!("{e:#}")
}

/// A reload that cannot load the new policy's functions still applies what it revokes: the
/// old policy stays, less the tenants the new one removes (they were served until a reload
/// succeeded), and less the grants and the deploy right it takes from a tenant it keeps
/// (those came back with the old policy: alice read outside her new grant and ran her
/// upload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_fails_on_a_function_still_revokes() {
    let h = TestHost::start().await;
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    let bob_read = || read("secret", &["bob/data.bin"]);
    assert_eq!(
        raw(h.invoke(BOB, "hostile", bob_read()).await).await,
        b"bob's data"
    );
    let (start, end) = (
        original.find("[tenants.bob]").expect("bob"),
        original.find("[tenants.tight]").expect("tight"),
    );
    // An upload of alice's, served while she may deploy.
    let wasm = std::fs::read(common::guest("hostile")).expect("wasm");
    assert_eq!(
        h.put_function(ALICE, "mine", wasm.clone()).await.status(),
        201
    );
    let small = read("datasets", &["fashion-mnist/small.bin"]);
    assert_eq!(h.invoke(ALICE, "mine", small.clone()).await.status(), 200);
    // Bob removed; alice's grant narrowed to `fashion-mnist/test/`, and her deploy right
    // taken; and a function of hers that does not build.
    let changed =
        with_a_broken_function(&h, &format!("{}{}", &original[..start], &original[end..]))
            .replacen(
                "prefix = \"fashion-mnist/\"",
                "prefix = \"fashion-mnist/test/\"",
                1,
            )
            .replacen("deploy = true", "deploy = false", 1);
    let e = failed_reload(&h, &changed).await;
    assert!(
        e.contains(
            "less what the new one revokes (tenant `bob` removed, tenant `alice`'s grants \
             narrowed, tenant `alice`'s deploy right)"
        ),
        "{e}"
    );
    assert!(e.contains("broken"), "{e}");
    let (code, message) = error_code(h.invoke(BOB, "hostile", bob_read()).await, 401).await;
    assert_eq!(code, "bad_token", "{message}");
    // The rest of the old policy stays, less what the new one takes: alice is served, without
    // the broken function, reads only under `fashion-mnist/test/`, and deploys nothing.
    assert!(h.host.function("alice", "broken").is_none());
    let denied = h
        .invoke(
            ALICE,
            "hostile",
            read("datasets", &["fashion-mnist/small.bin"]),
        )
        .await;
    let (code, message) = error_code(denied, 403).await;
    assert_eq!(code, "object_denied", "{message}");
    let sample = sample_key(0);
    let png = raw(h
        .invoke(ALICE, "hostile", read("datasets", &[&sample]))
        .await)
    .await;
    assert!(png.starts_with(b"\x89PNG"), "{} bytes", png.len());
    let (code, message) = error_code(h.put_function(ALICE, "other", wasm).await, 403).await;
    assert_eq!(code, "deploy_not_allowed", "{message}");
    let (code, message) = error_code(h.invoke(ALICE, "mine", small).await, 404).await;
    assert_eq!(code, "function_not_found", "{message}");
    // Restored, alice reads her own again, and her upload is served.
    h.reload(&original).await.expect("reloaded");
    alice_reads_her_own(&h).await;
    assert!(h.host.function("alice", "mine").is_some());
}

/// A reload that fails on a function and changes a tenant's token and grant: the tenant deploys
/// and removes with its new token (its uploads were refused once compiled, 401, and it could
/// remove nothing, until a reload succeeded), and its grant is what both policies grant, by
/// directory: `fashion` grants `fashion/...`, none of `fashion-mnist/` (which was kept, as it
/// starts with `fashion`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_fails_narrows_what_deploys_are_held_to() {
    const ROTATED: &str = "alice-rotated-token";
    let h = TestHost::start().await;
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    let changed = with_a_broken_function(&h, &original)
        .replacen(&hash_token(ALICE), &hash_token(ROTATED), 1)
        .replacen("prefix = \"fashion-mnist/\"", "prefix = \"fashion\"", 1);
    let e = failed_reload(&h, &changed).await;
    assert!(
        e.contains("tenant `alice`'s new token, tenant `alice`'s grants narrowed"),
        "{e}"
    );
    let small = read("datasets", &["fashion-mnist/small.bin"]);
    let (code, message) = error_code(h.invoke(ROTATED, "hostile", small).await, 403).await;
    assert_eq!(code, "object_denied", "{message}");
    let wasm = std::fs::read(common::guest("hostile")).expect("wasm");
    assert_eq!(h.put_function(ROTATED, "mine", wasm).await.status(), 201);
    assert_eq!(h.delete_function(ROTATED, "mine").await.status(), 204);
    assert!(h.host.function("alice", "mine").is_none());
    let (code, message) =
        error_code(h.put_function(ALICE, "mine", b"\0asm".to_vec()).await, 401).await;
    assert_eq!(code, "bad_token", "{message}");
}

/// A reload reaches a running invocation at its next host call that uses a grant: one reading
/// an object over and over stops being served once the grant is taken away (the guest sees
/// `denied`) or the tenant's token changes (the invocation stops, 401). It read under the
/// grants it started with until its time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reaches_a_running_invocation_at_its_next_read() {
    let h = TestHost::start().await;
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    for (changed, status, expected, says) in revocations(&original) {
        h.reload(&original).await.expect("reloaded");
        alice_reads_her_own(&h).await;
        let alice = h.host.policy().tenants["alice"].clone();
        let admission = h.host.admission(&alice);
        reach(&admission, (0, 0), "the first read's slot given back").await;
        // Reads of one small object, far more than alice's 20 s allow.
        let body = hostile(
            "reread",
            &[("count", "1000000000")],
            &["fashion-mnist/small.bin"],
        );
        let (client, url) = (h.client.clone(), h.url.clone());
        let rereading =
            tokio::spawn(
                async move { common::invoke_at(&client, &url, ALICE, "hostile", body).await },
            );
        reach(&admission, (1, 0), "the rereading call running").await;
        // Reading by now (its body is a few hundred bytes, its reads microseconds apart).
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        h.reload(&changed).await.expect("reloaded");
        let (code, message) = error_code(rereading.await.expect("join"), status).await;
        assert_eq!(code, expected, "{message}");
        assert!(message.contains(says), "{message}");
        // Stopped while it ran, not refused before it started.
        if status == 401 {
            assert!(message.contains("while its invocation ran"), "{message}");
        }
    }
}

/// A response's `x-request-id` says nothing of other requests: ids polled from `/healthz`
/// (no token needed) by one client, while another tenant's calls come in between, are unique
/// and unordered. They were a counter in the clear (and the process's start time), so two
/// polls told anyone how many requests the host had had from everyone in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_do_not_count_other_tenants_requests() {
    let h = TestHost::start().await;
    let id = |r: reqwest::Response| {
        assert_eq!(r.status(), 200);
        let v = r.headers().get("x-request-id").expect("x-request-id");
        // Its last part, where an id had a counter after the start time.
        let id = v
            .to_str()
            .expect("ascii id")
            .rsplit('-')
            .next()
            .unwrap_or_default();
        u64::from_str_radix(id, 16).expect("a hexadecimal id")
    };
    let mut ids = Vec::new();
    for _ in 0..64 {
        let r = h.client.get(format!("{}/healthz", h.url)).send().await;
        ids.push(id(r.expect("healthz")));
        for _ in 0..3 {
            let r = h
                .client
                .get(format!("{}/v1/functions", h.url))
                .bearer_auth(BOB);
            assert_eq!(r.send().await.expect("list").status(), 200);
        }
    }
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "ids repeat: {ids:x?}");
    assert_ne!(sorted, ids, "ids come in order: {ids:x?}");
    let steps: std::collections::BTreeSet<u64> =
        ids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(steps.len() > 32, "steps between ids repeat: {steps:?}");
}

/// A reload is checked against the store the host runs with: `store` changes only at a
/// restart, so a reload that moved the store elsewhere and a tenant's `private_models` into
/// the running store passed the check against the new store, and the tenant's private weights
/// were readable through a grant on their bucket until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_hosts_directories_out_of_the_running_store() {
    let h = TestHost::start().await;
    let original = std::fs::read_to_string(&h.policy_path).expect("policy");
    let running = format!("store = \"{}\"", h.store.display());
    assert!(original.contains(&running), "{original}");
    let elsewhere = h.store.with_file_name("new-store");
    let private = h.store.join("alice-models");
    std::fs::create_dir_all(&private).expect("mkdir");
    let text = original
        .replace(&running, &format!("store = \"{}\"", elsewhere.display()))
        .replace(
            "[tenants.alice.functions]",
            &format!(
                "private_models = \"{}\"\n[tenants.alice.functions]",
                private.display()
            ),
        );
    assert_ne!(text, original);
    let e = format!("{:#}", h.reload(&text).await.expect_err("refused"));
    assert!(
        e.contains("tenants.alice.private_models = ") && e.contains("is inside host.store"),
        "{e}"
    );
    assert!(e.contains("the old policy stays"), "{e}");
}
