//! One conformance suite for the `objects` capability, run on every backend: the local store
//! (cap-std) and a real S3 server (SeaweedFS). Plus the whole pushdown path over S3.

mod common;

use common::seaweed::Seaweed;
use common::{ALICE, SAMPLES, TestHost, error_code, features, layout, sample_key};
use hapi_host::policy::{Grant, Limits, Locality, S3Settings, StoreLocation, Tenant};
use hapi_host::store::scoped::Scoped;
use hapi_host::store::{ObjectError, ObjectMeta, Store};
use serde_json::json;
use std::sync::Arc;

fn tenant() -> Arc<Tenant> {
    Arc::new(Tenant {
        name: "alice".into(),
        token_sha256: [0; 32],
        grants: vec![Grant {
            bucket: "datasets".into(),
            prefix: "fashion-mnist/".into(),
        }],
        models: Default::default(),
        private_models: Vec::new(),
        limits: Limits {
            max_object: 2048,
            max_read: 3072,
            ..Limits::default()
        },
        deploy: false,
        capabilities: Default::default(),
        functions: Default::default(),
    })
}

/// The keys of a listing.
fn keys(listed: Vec<ObjectMeta>) -> Vec<String> {
    listed.into_iter().map(|m| m.key).collect()
}

async fn get(o: &mut Scoped, bucket: &str, key: &str) -> Result<Vec<u8>, ObjectError> {
    let planned = o.plan(bucket, key, None).await?;
    o.read(&planned).await
}

async fn get_range(
    o: &mut Scoped,
    bucket: &str,
    key: &str,
    offset: u64,
    length: u64,
) -> Result<Vec<u8>, ObjectError> {
    let planned = o.plan(bucket, key, Some((offset, length))).await?;
    o.read(&planned).await
}

/// The suite: every backend must behave the same.
async fn conformance(store: Arc<Store>) {
    let fresh = || Scoped::new(tenant(), Arc::clone(&store));
    let mut o = fresh();
    let small = "fashion-mnist/small.bin";
    assert_eq!(get(&mut o, "datasets", small).await, Ok(vec![1u8; 1024]));
    assert_eq!(
        get_range(&mut o, "datasets", small, 100, 50).await,
        Ok(vec![1u8; 50])
    );
    assert_eq!(
        get_range(&mut o, "datasets", small, 1000, 100).await,
        Ok(vec![1u8; 24])
    );
    // Past the end, however far: empty, not an error.
    let mut o = fresh();
    for offset in [5000, u64::MAX - 5, u64::MAX] {
        assert_eq!(
            get_range(&mut o, "datasets", small, offset, 10).await,
            Ok(vec![]),
            "offset {offset}"
        );
    }
    assert_eq!(
        get_range(&mut o, "datasets", small, 10, u64::MAX).await,
        Ok(vec![1u8; 1014])
    );
    let head = o.head("datasets", small).await.expect("head");
    assert_eq!(head.size, 1024);
    assert!(head.last_modified_ms > 1_600_000_000_000, "{head:?}");
    assert!(matches!(
        get(&mut o, "datasets", "fashion-mnist/nope.bin").await,
        Err(ObjectError::NotFound(k)) if k.contains("fashion-mnist/nope.bin")
    ));
    // Keys that cannot exist are the caller's mistake, not the store's failure.
    let long_segment = format!("fashion-mnist/{}.png", "a".repeat(300));
    for key in [
        long_segment.as_str(),
        "fashion-mnist/small.bin/x",
        "fashion-mnist/small.bin/x/y",
    ] {
        let r = get(&mut o, "datasets", key).await;
        assert!(matches!(r, Err(ObjectError::NotFound(_))), "{key}: {r:?}");
        let r = o.head("datasets", key).await;
        assert!(matches!(r, Err(ObjectError::NotFound(_))), "{key}: {r:?}");
    }

    // Byte caps: one object over 2 KiB; an invocation over 3 KiB.
    let mut o = fresh();
    assert_eq!(
        get(&mut o, "datasets", "fashion-mnist/big.bin").await,
        Err(ObjectError::TooLarge(2048))
    );
    for _ in 0..3 {
        get(&mut o, "datasets", small)
            .await
            .expect("within the read cap");
    }
    assert_eq!(
        get(&mut o, "datasets", small).await,
        Err(ObjectError::TooLarge(3072))
    );
    assert_eq!(o.bytes_read, 3072);

    // Denied, whatever the backend.
    let mut o = fresh();
    for (bucket, key) in [
        ("datasets", "private/notes.txt"),
        ("secret", "bob/data.bin"),
        ("datasets", "../secret/bob/data.bin"),
        ("datasets", "fashion-mnist/../private/notes.txt"),
        ("datasets", "/etc/passwd"),
        ("datasets", "fashion-mnist//small.bin"),
    ] {
        assert!(
            matches!(get(&mut o, bucket, key).await, Err(ObjectError::Denied(_))),
            "{bucket}/{key}"
        );
        assert!(
            matches!(o.head(bucket, key).await, Err(ObjectError::Denied(_))),
            "{bucket}/{key}"
        );
    }

    // Listing: sorted, within the grant only, limited.
    let mut granted: Vec<String> = layout()
        .into_iter()
        .filter(|(b, k, _)| *b == "datasets" && k.starts_with("fashion-mnist/"))
        .map(|(_, k, _)| k)
        .collect();
    granted.sort();
    assert_eq!(
        keys(
            o.list("datasets", "fashion-mnist/", 1000)
                .await
                .expect("list")
        ),
        granted
    );
    assert_eq!(
        keys(
            o.list("datasets", "", 1000)
                .await
                .expect("list everything granted")
        ),
        granted
    );
    assert_eq!(
        keys(
            o.list("datasets", "fashion-mnist/s", 1000)
                .await
                .expect("list")
        ),
        ["fashion-mnist/small.bin"]
    );
    assert_eq!(
        keys(o.list("datasets", "fashion-mnist/", 2).await.expect("list")),
        granted[..2]
    );
    // A prefix ending partway through a name visits what matches it (on the local store, the
    // entries of `fashion-mnist/`: four), not everything under its directory: S3 listed all of
    // `fashion-mnist/` (nine objects) and was refused.
    assert_eq!(
        o.list_within("datasets", "fashion-mnist/s", 10, 4)
            .await
            .map(keys),
        Ok(vec!["fashion-mnist/small.bin".to_string()])
    );
    // A prefix no object can have: nothing, not an error.
    let deep = format!("fashion-mnist/{}/", "d".repeat(300));
    assert_eq!(o.list("datasets", &deep, 10).await, Ok(vec![]));
    assert_eq!(
        o.list("datasets", "fashion-mnist/small.bin/", 10).await,
        Ok(vec![])
    );
    let too_long = format!("fashion-mnist/{}", "d".repeat(2000));
    assert!(matches!(
        o.list("datasets", &too_long, 10).await,
        Err(ObjectError::Denied(_))
    ));
    assert!(matches!(
        o.list("datasets", "private/", 10).await,
        Err(ObjectError::Denied(_))
    ));
    assert!(matches!(
        o.list("secret", "", 10).await,
        Err(ObjectError::Denied(_))
    ));
}

#[tokio::test]
async fn local_store_conforms() {
    let tmp = tempfile::tempdir().expect("tmp");
    common::write_store(tmp.path());
    conformance(Arc::new(
        Store::open(&StoreLocation::Local(tmp.path().to_path_buf())).expect("local store"),
    ))
    .await;
}

/// Dropping an S3 store on an async thread (a failed start, the end of a test) must neither
/// panic nor block.
#[tokio::test]
async fn an_s3_store_can_be_dropped_on_an_async_thread() {
    let store = Store::open(&StoreLocation::S3(S3Settings {
        endpoint: "http://127.0.0.1:9".into(),
        region: "us-east-1".into(),
        access_key_id: Some("k".into()),
        secret_access_key: Some("s".into()),
        locality: None,
    }))
    .expect("S3 store");
    drop(store);
}

/// A key the store cannot serve (here with a control character, legal in S3) is skipped by a
/// listing over it, as the local store skips names it cannot list: it failed the whole
/// listing, every page of it, answered 403 `object_denied` for the prefix, so that anyone who
/// could write one object under a prefix denied every lister its listings. Keys it can serve
/// are listed as they are.
async fn a_listing_skips_a_key_it_cannot_serve(weed: &Seaweed, store: Arc<Store>) {
    let mut o = Scoped::new(tenant(), store);
    let before = keys(
        o.list("datasets", "fashion-mnist/", 1000)
            .await
            .expect("list"),
    );
    weed.put("datasets", "fashion-mnist/odd\u{7f}name.bin", vec![1])
        .await;
    assert_eq!(
        o.list("datasets", "fashion-mnist/", 1000).await.map(keys),
        Ok(before.clone()),
        "the listing, past a key with a control character"
    );
    // Within the visits, which count it.
    let n = before.len() + 1;
    assert!(
        o.list_within("datasets", "fashion-mnist/", 1000, n)
            .await
            .is_ok()
    );
    assert_eq!(
        o.list_within("datasets", "fashion-mnist/", 1000, n - 1)
            .await,
        Err(ObjectError::TooManyEntries(n as u64 - 1))
    );
    // A key with spaces at its ends, `+` and `%` is listed as it is, and read by what the
    // listing gave (the XML parser dropped the spaces, so the key listed was another).
    weed.put("datasets", "fashion-mnist/%20edge+1%25%20", vec![7])
        .await;
    let listed = keys(
        o.list("datasets", "fashion-mnist/", 1000)
            .await
            .expect("list"),
    );
    let edge = "fashion-mnist/ edge+1% ";
    assert!(listed.iter().any(|k| k == edge), "{listed:?}");
    assert_eq!(get(&mut o, "datasets", edge).await, Ok(vec![7]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_conforms_and_serves_the_whole_pushdown_path() {
    let weed = Seaweed::start();
    for (bucket, key, bytes) in layout() {
        weed.put(bucket, &key, bytes).await;
    }
    let settings = S3Settings {
        endpoint: weed.s3.clone(),
        region: "us-east-1".into(),
        access_key_id: Some(common::seaweed::ACCESS_KEY.into()),
        secret_access_key: Some(common::seaweed::SECRET_KEY.into()),
        locality: None,
    };
    let store = Arc::new(Store::open(&StoreLocation::S3(settings.clone())).expect("S3 store"));
    conformance(Arc::clone(&store)).await;

    // Beside the volume server: the same answers, read from it instead of through S3.
    let near = Arc::new(
        Store::open(&StoreLocation::S3(S3Settings {
            locality: Some(Locality {
                filer: weed.filer.clone(),
                volume_server: weed.volume.clone(),
            }),
            ..settings
        }))
        .expect("S3 store with locality"),
    );
    conformance(Arc::clone(&near)).await;
    let report = near.locality().expect("locality").report().await;
    assert!(
        report.local_reads > 0 && !report.volumes.is_empty(),
        "nothing was read from the volume server: {report:?}"
    );

    // Wrong credentials are an I/O error, not a crash.
    let bad = Store::open(&StoreLocation::S3(S3Settings {
        endpoint: weed.s3.clone(),
        region: "us-east-1".into(),
        access_key_id: Some("nobody".into()),
        secret_access_key: Some("wrong".into()),
        locality: None,
    }))
    .expect("store");
    let mut o = Scoped::new(tenant(), Arc::new(bad));
    let err = get(&mut o, "datasets", "fashion-mnist/small.bin").await;
    assert!(matches!(err, Err(ObjectError::Io(_))), "{err:?}");
    let Err(ObjectError::Io(said)) = err else {
        unreachable!()
    };
    assert!(
        said.contains(&weed.s3),
        "the store's error names its endpoint: {said}"
    );
    // ... which is the operator's: a guest is told only that the store failed on its key.
    let tmp = tempfile::tempdir().expect("tmp");
    let wrong = weed
        .policy_section()
        .replace(common::seaweed::SECRET_KEY, "wrong");
    let text = common::policy_text_for("store = \"s3://\"", &wrong, &tmp.path().join("state"));
    let wrong_host = TestHost::start_with(tmp, std::path::PathBuf::new(), text).await;
    let key = sample_key(0);
    let told = common::raw(
        wrong_host
            .invoke(
                ALICE,
                "hostile",
                json!({"bucket": "datasets", "keys": [&key], "options": {"mode": "read", "say": "errors"}}),
            )
            .await,
    )
    .await;
    let told = String::from_utf8_lossy(&told);
    assert!(
        told.contains(&format!("the object store failed on `{key}`; retry later")),
        "{told}"
    );
    assert!(
        !told.contains("127.0.0.1") && !told.contains("http"),
        "{told}"
    );
    // A guest that returns the failure: the client gets 503 `store_unavailable` (not
    // `host_fault`) with a request id and `Retry-After`, and still not the endpoint.
    let failed = wrong_host
        .invoke(
            ALICE,
            "hostile",
            json!({"bucket": "datasets", "keys": [&key], "options": {"mode": "read"}}),
        )
        .await;
    assert_eq!(failed.status(), 503);
    assert!(failed.headers().contains_key("retry-after"));
    let said: serde_json::Value = failed.json().await.expect("a JSON error");
    assert_eq!(said["code"], "store_unavailable", "{said}");
    assert!(said["request_id"].is_string(), "{said}");
    let said = said.to_string();
    assert!(
        said.contains("the object store failed; retry later")
            && !said.contains("127.0.0.1")
            && !said.contains("http"),
        "{said}"
    );
    drop(wrong_host);

    // The host over S3: features equal those over the local store.
    let tmp = tempfile::tempdir().expect("tmp");
    let text = common::policy_text_for(
        "store = \"s3://\"",
        &weed.policy_section(),
        &tmp.path().join("state"),
    );
    let s3_host = TestHost::start_with(tmp, std::path::PathBuf::new(), text).await;
    let local_host = TestHost::start().await;
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    let body = json!({"bucket": "datasets", "keys": keys, "model": "resnet18", "split": 6});
    let (s3_shape, s3) = features(s3_host.warm(ALICE, "feature-extract", body.clone()).await).await;
    let (local_shape, local) = features(
        local_host
            .warm(ALICE, "feature-extract", body.clone())
            .await,
    )
    .await;
    assert_eq!(s3_shape, local_shape);
    assert_eq!(s3, local);

    // A host beside the volume server: the same features, its objects read from that server;
    // `/v1/placement` tells its volumes and the keys', within the tenant's grants.
    let tmp = tempfile::tempdir().expect("tmp");
    let near_section = format!(
        "{}seaweedfs_filer = \"{}\"\nlocal_volume_server = \"{}\"\n",
        weed.policy_section(),
        weed.filer,
        weed.volume
    );
    let text = common::policy_text_for(
        "store = \"s3://\"",
        &near_section,
        &tmp.path().join("state"),
    );
    let near_host = TestHost::start_with(tmp, std::path::PathBuf::new(), text).await;
    let (near_shape, near) = features(near_host.warm(ALICE, "feature-extract", body).await).await;
    assert_eq!((near_shape, near), (local_shape, local));
    let url = format!("{}/v1/placement", near_host.url);
    let report: serde_json::Value = near_host
        .client
        .get(&url)
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("placement")
        .json()
        .await
        .expect("JSON");
    let held: Vec<u64> = report["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    assert!(!held.is_empty(), "{report}");
    // The volumes only: the node's read counters (every tenant's reads) and the volume
    // server's address are the operator's.
    assert_eq!(
        report.as_object().map(serde_json::Map::len),
        Some(1),
        "{report}"
    );
    let metrics = near_host.metrics().await;
    let counted = |from: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("hapi_locality_reads_total{{from=\"{from}\"}} ")))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no hapi_locality_reads_total from {from}:\n{metrics}"))
    };
    assert!(counted("local") >= keys.len() as u64, "{metrics}");
    let ask = |keys: Vec<String>| {
        near_host
            .client
            .post(&url)
            .bearer_auth(ALICE)
            .json(&json!({"bucket": "datasets", "keys": keys}))
            .send()
    };
    let answer: serde_json::Value = ask(keys.clone())
        .await
        .expect("placement")
        .json()
        .await
        .expect("JSON");
    let volumes = answer["volumes"].as_array().expect("volumes");
    assert_eq!(volumes.len(), keys.len());
    for v in volumes {
        let v = v[0].as_u64().expect("a volume per key");
        assert!(held.contains(&v), "volume {v} of {held:?}");
    }
    // Each filer lookup is counted for the tenant that asked: the filer serves every host and
    // the gateway, and who loads it is the operator's to see (it was counted nowhere).
    let unique: std::collections::HashSet<&String> = keys.iter().collect();
    let metrics = near_host.metrics().await;
    assert!(
        metrics.contains(&format!(
            "hapi_placement_lookups_total{{tenant=\"alice\"}} {}\n",
            unique.len()
        )),
        "{metrics}"
    );
    let outside = ask(vec!["../secret/bob/x".into()]).await.expect("request");
    assert_eq!(error_code(outside, 400).await.0, "bad_request");
    let ungranted = ask(vec!["other/x.png".into()]).await.expect("request");
    assert_eq!(error_code(ungranted, 403).await.0, "object_denied");
    let too_many = ask(vec![sample_key(0); 1025]).await.expect("request");
    assert_eq!(error_code(too_many, 400).await.0, "bad_request");
    let plain = s3_host
        .client
        .get(format!("{}/v1/placement", s3_host.url))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("request");
    assert_eq!(error_code(plain, 404).await.0, "no_route");
    // Last: the key it adds is under every prefix the suite lists.
    a_listing_skips_a_key_it_cannot_serve(&weed, store).await;
}

/// A listing of a grant's parent (`""`, or part of the grant's name) walks the grants only: it
/// walked the whole bucket, other tenants' directories included, up to the visit bound (whose
/// error then told how large they were).
#[tokio::test]
async fn a_listing_above_the_grants_walks_only_the_grants() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mine = tmp.path().join("datasets/fashion-mnist");
    std::fs::create_dir_all(&mine).expect("mkdir");
    for i in 0..3 {
        std::fs::write(mine.join(format!("{i}.png")), b"x").expect("write");
    }
    let other = tmp.path().join("datasets/other-tenant");
    for d in 0..100 {
        std::fs::create_dir_all(other.join(format!("{d}"))).expect("mkdir");
    }
    let store =
        Arc::new(Store::open(&StoreLocation::Local(tmp.path().to_path_buf())).expect("store"));
    let o = Scoped::new(tenant(), store);
    for prefix in ["", "fash", "fashion-mnist/"] {
        let listed = o.list_within("datasets", prefix, 10, 20).await;
        let keys: Vec<String> = listed
            .unwrap_or_else(|e| panic!("listing {prefix:?}: {e}"))
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(
            keys,
            [
                "fashion-mnist/0.png",
                "fashion-mnist/1.png",
                "fashion-mnist/2.png"
            ],
            "{prefix:?}"
        );
    }
    assert!(matches!(
        o.list_within("datasets", "other-tenant/", 10, 20).await,
        Err(ObjectError::Denied(_))
    ));
}

/// A listing above two grants of one bucket walks both and answers the smallest keys of the
/// two, in order; the visit bound is the listing's, shared by its walks, and past it the error
/// names the whole bound (each walk's part of it is an implementation detail).
#[tokio::test]
async fn a_listing_over_two_grants_merges_them_and_shares_its_visit_bound() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (dir, names) in [("a", &["1"][..]), ("b", &["2", "4", "6"])] {
        let path = tmp.path().join("datasets").join(dir);
        std::fs::create_dir_all(&path).expect("mkdir");
        for n in names {
            std::fs::write(path.join(n), b"x").expect("write");
        }
    }
    let grant = |prefix: &str| Grant {
        bucket: "datasets".into(),
        prefix: prefix.into(),
    };
    let mut two = Arc::unwrap_or_clone(tenant());
    two.grants = vec![grant("b"), grant("a/")];
    let store =
        Arc::new(Store::open(&StoreLocation::Local(tmp.path().to_path_buf())).expect("store"));
    let o = Scoped::new(Arc::new(two), store);
    assert_eq!(
        keys(o.list_within("datasets", "", 3, 100).await.expect("list")),
        ["a/1", "b/2", "b/4"].map(String::from),
        "the smallest of both grants, in key order (named `b`, `a/`: either form of a prefix)"
    );
    assert_eq!(
        keys(o.list("datasets", "", 100).await.expect("list")).len(),
        4
    );
    // The walks visit 1 and 3 entries: a bound of 5 gives each walk 3 and passes, 4 gives
    // each 2.
    assert!(o.list_within("datasets", "", 100, 5).await.is_ok());
    assert_eq!(
        o.list_within("datasets", "", 100, 4).await,
        Err(ObjectError::TooManyEntries(4))
    );
    // What the first walk found (one entry) is charged while the second walk charges its
    // three: at its peak the listing held the four entries' strings and places at once, as the
    // host holds them.
    let charged = |limit: u64| {
        let account = hapi_host::account::Account::new(limit);
        let mut two = Arc::unwrap_or_clone(tenant());
        two.grants = vec![grant("b"), grant("a/")];
        let store =
            Arc::new(Store::open(&StoreLocation::Local(tmp.path().to_path_buf())).expect("store"));
        let o = Scoped::new(Arc::new(two), store).charged_to(Arc::clone(&account));
        (o, account)
    };
    let (o, account) = charged(1 << 30);
    let listed = o.list("datasets", "", 100).await.expect("list");
    assert_eq!(account.used(), 0, "released with the listing");
    let all: u64 = listed
        .iter()
        .map(|m| m.heap_bytes() + hapi_host::store::error::META_SLOT as u64)
        .sum();
    let peak = account.peak();
    assert!(
        peak >= all,
        "peak {peak} < {all}: the first walk's entry was held uncharged"
    );
    let (o, _) = charged(peak);
    assert!(o.list("datasets", "", 100).await.is_ok());
    let (o, _) = charged(peak - 1);
    assert!(
        matches!(
            o.list("datasets", "", 100).await,
            Err(ObjectError::OverLimit(_))
        ),
        "a limit under its peak charge let it through"
    );
}

/// The listing bounds, obeyed and violated, on the local store: at most `MAX_LIST` entries come
/// back however many match, and a listing that would visit more entries than its bound fails
/// instead of walking on.
#[tokio::test]
async fn listing_bounds_obeyed_and_violated() {
    use hapi_host::store::MAX_LIST;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("datasets/fashion-mnist/many");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let n = MAX_LIST as usize + 1;
    for i in 0..n {
        std::fs::write(dir.join(format!("{i:06}")), b"").expect("write");
    }
    let store =
        Arc::new(Store::open(&StoreLocation::Local(tmp.path().to_path_buf())).expect("store"));
    let o = Scoped::new(tenant(), store);
    let all = o
        .list("datasets", "fashion-mnist/many/", u32::MAX)
        .await
        .expect("list");
    assert_eq!(all.len(), MAX_LIST as usize, "capped");
    assert_eq!(all[0].key, "fashion-mnist/many/000000");
    assert_eq!(
        all.last().map(|m| m.key.as_str()),
        Some("fashion-mnist/many/009999"),
        "the smallest keys, in order"
    );
    assert!(
        o.list_within("datasets", "fashion-mnist/", 10, n + 10)
            .await
            .is_ok()
    );
    assert_eq!(
        o.list_within("datasets", "fashion-mnist/", 10, n - 1).await,
        Err(ObjectError::TooManyEntries((n - 1) as u64))
    );
}

/// A placement request is bounded by its tenant's time limit, as an invocation is: against a
/// filer that does not answer, `tight`'s (1 s limit) 64 keys were looked up eight at a time,
/// each waiting for the client's 10 s timeout, holding its slot and its share of the lookups
/// for 80 s. At the limit it answers what it found (here nothing: no volumes for any key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_request_ends_at_its_tenants_time_limit() {
    // A filer that accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let filer = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let tmp = tempfile::tempdir().expect("tmp");
    let section = format!(
        "[host.s3]\nendpoint = \"http://127.0.0.1:9\"\nseaweedfs_filer = \"{filer}\"\nlocal_volume_server = \"http://127.0.0.1:9\"\n"
    );
    let text = common::policy_text_for("store = \"s3://\"", &section, &tmp.path().join("state"));
    let h = TestHost::start_with(tmp, std::path::PathBuf::new(), text).await;
    let keys: Vec<String> = (0..64).map(sample_key).collect();
    let started = std::time::Instant::now();
    let ask = h
        .client
        .post(format!("{}/v1/placement", h.url))
        .bearer_auth(common::TIGHT)
        .json(&json!({"bucket": "datasets", "keys": keys}))
        .send();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(30), ask)
        .await
        .expect("answered at the tenant's limit, not once every lookup had ended")
        .expect("placement");
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.expect("JSON");
    let volumes = answer["volumes"].as_array().expect("volumes");
    assert_eq!(volumes.len(), 64);
    assert!(volumes.iter().all(|v| v == &json!([])), "{answer}");
    eprintln!("answered in {:?}", started.elapsed());
}

/// Placement requests refused before any lookup (a body that is not JSON, too many keys, a
/// key outside the grants) are counted per tenant, as every other endpoint's refusals are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_placement_requests_are_counted_for_their_tenant() {
    let tmp = tempfile::tempdir().expect("tmp");
    let section = "[host.s3]\nendpoint = \"http://127.0.0.1:9\"\nseaweedfs_filer = \"http://127.0.0.1:9\"\nlocal_volume_server = \"http://127.0.0.1:9\"\n";
    let text = common::policy_text_for("store = \"s3://\"", section, &tmp.path().join("state"));
    let h = TestHost::start_with(tmp, std::path::PathBuf::new(), text).await;
    let ask = |body: String| {
        h.client
            .post(format!("{}/v1/placement", h.url))
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let too_many: Vec<String> = (0..1025).map(sample_key).collect();
    for (body, status) in [
        ("{".to_string(), 400),
        (
            json!({"bucket": "datasets", "keys": too_many}).to_string(),
            400,
        ),
        (
            json!({"bucket": "secret", "keys": ["bob/data.bin"]}).to_string(),
            403,
        ),
    ] {
        assert_eq!(ask(body).await.expect("placement").status(), status);
    }
    let metrics = h.metrics().await;
    for line in [
        "hapi_refused_total{tenant=\"alice\",endpoint=\"placement\",code=\"bad_json\"} 1",
        "hapi_refused_total{tenant=\"alice\",endpoint=\"placement\",code=\"bad_request\"} 1",
        "hapi_refused_total{tenant=\"alice\",endpoint=\"placement\",code=\"object_denied\"} 1",
    ] {
        assert!(metrics.contains(line), "no `{line}` in:\n{metrics}");
    }
}
