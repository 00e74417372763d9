//! Policy files: unknown keys and bad values are errors naming the key and the line.

use hapi_host::policy::{Policy, hash_token};
use std::path::Path;

fn parse(text: &str) -> Result<Policy, String> {
    Policy::parse("policy.toml", text, Path::new("/srv")).map_err(|e| e.to_string())
}

fn with_tenant(extra: &str) -> String {
    format!(
        "[host]\nstore = \"store\"\nmodels = \"models\"\nstate = \"state\"\n\n[tenants.alice]\ntoken_sha256 = \"{}\"\n{extra}\n",
        hash_token("t")
    )
}

#[test]
fn a_valid_policy_parses_with_defaults_and_relative_paths() {
    let p = parse(&with_tenant(
        "grants = [{ bucket = \"datasets\", prefix = \"a/\" }]\nmodels = [\"resnet18\"]",
    ))
    .expect("valid");
    assert_eq!(
        p.host.store,
        hapi_host::policy::StoreLocation::Local("/srv/store".into())
    );
    assert_eq!(p.host.listen.to_string(), "127.0.0.1:8080");
    let alice = &p.tenants["alice"];
    assert_eq!(alice.limits.memory, 256 << 20);
    assert!(!alice.deploy);
    assert!(
        p.tenant_by_token_hash(&hapi_host::policy::token_digest("t"))
            .is_some()
    );
    assert!(
        p.tenant_by_token_hash(&hapi_host::policy::token_digest("u"))
            .is_none()
    );
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let e = parse(&with_tenant("memroy = \"1GiB\"")).expect_err("typo");
    assert!(e.contains("policy.toml line 8"), "{e}");
    assert!(e.contains("unknown field `memroy`"), "{e}");
    let e = parse("[host]\nstore = \"s\"\nmodels = \"m\"\nstate = \"x\"\nlisten_addr = \"1\"\n")
        .expect_err("typo");
    assert!(
        e.contains("line 5") && e.contains("unknown field `listen_addr`"),
        "{e}"
    );
}

#[test]
fn bad_values_are_named_with_key_and_line() {
    for (extra, needle) in [
        (
            "memory = \"12XB\"",
            "tenants.alice.memory: `12XB`: unknown unit `XB`",
        ),
        (
            "memory = \"8GiB\"",
            "tenants.alice.memory: must be 1MiB..=4GiB",
        ),
        (
            "timeout = \"30\"",
            "tenants.alice.timeout: `30` needs a unit",
        ),
        (
            "concurrency = 0",
            "tenants.alice.concurrency = 0: must be 1..=64",
        ),
        ("queue = -1", "tenants.alice.queue = -1: must be 0..=1024"),
        (
            "capabilities = [\"sockets\"]",
            "unknown capability `sockets`",
        ),
        (
            "grants = [{ bucket = \"d\", prefix = \"../x\" }]",
            "prefix `../x` must be relative",
        ),
        // No key has an empty segment: the grant would give nothing, silently.
        (
            "grants = [{ bucket = \"d\", prefix = \"team//alice/\" }]",
            "prefix `team//alice/` must be relative, without empty",
        ),
    ] {
        let e = parse(&with_tenant(extra)).expect_err(extra);
        assert!(e.contains("policy.toml line 8"), "{extra}: {e}");
        assert!(e.contains(needle), "{extra}: {e}");
    }
    let e = parse("[host]\nstore = \"s\"\nmodels = \"m\"\nstate = \"x\"\nlisten = \"localhost\"\n")
        .expect_err("listen");
    assert!(e.contains("line 5") && e.contains("host.listen"), "{e}");
    let e = parse("[host]\nstore = \"s\"\nmodels = \"m\"\nstate = \"x\"\n[tenants.a]\ntoken_sha256 = \"abc\"\n").expect_err("hash");
    assert!(e.contains("line 6") && e.contains("64 hex digits"), "{e}");
    let e = parse("[host]\nstore = \"s\"\n").expect_err("missing");
    assert!(e.contains("missing field `models`"), "{e}");
}

/// On S3: half a key pair would be ignored for the environment's credentials, and a bucket S3
/// refuses would fail every read as the store's fault; both are named at parse time.
#[test]
fn s3_credentials_and_bucket_names_are_checked() {
    let s3 = |s3: &str, bucket: &str| {
        format!(
            "[host]\nstore = \"s3://\"\nmodels = \"models\"\nstate = \"state\"\n[host.s3]\nendpoint = \"http://127.0.0.1:8333\"\n{s3}\n\n[tenants.alice]\ntoken_sha256 = \"{}\"\ngrants = [{{ bucket = \"{bucket}\" }}]\n",
            hash_token("t")
        )
    };
    let both = "access_key_id = \"k\"\nsecret_access_key = \"s\"";
    parse(&s3(both, "datasets")).expect("valid");
    parse(&s3("", "my-data-1")).expect("the environment's credentials");
    for half in ["access_key_id = \"k\"", "secret_access_key = \"s\""] {
        let e = parse(&s3(half, "datasets")).expect_err(half);
        assert!(e.contains("policy.toml line 7"), "{half}: {e}");
        assert!(
            e.contains("set access_key_id and secret_access_key together"),
            "{half}: {e}"
        );
    }
    for bucket in ["Data", "my_data", "ab", "-data"] {
        let e = parse(&s3(both, bucket)).expect_err(bucket);
        assert!(
            e.contains("an S3 bucket's name is 3 to 63"),
            "{bucket}: {e}"
        );
        // The same names serve a local store.
        parse(&with_tenant(&format!(
            "grants = [{{ bucket = \"{bucket}\" }}]"
        )))
        .unwrap_or_else(|e| panic!("{bucket} on a local store: {e}"));
    }
}

#[test]
fn two_tenants_with_one_token_are_refused() {
    let text = format!(
        "{}\n[tenants.bob]\ntoken_sha256 = \"{}\"\n",
        with_tenant(""),
        hash_token("t")
    );
    let e = parse(&text).expect_err("same token");
    assert!(e.contains("same token as tenant `alice`"), "{e}");
}

#[test]
fn two_tenant_names_that_differ_only_in_case_are_refused() {
    let text = format!(
        "{}\n[tenants.Alice]\ntoken_sha256 = \"{}\"\n",
        with_tenant(""),
        hash_token("another")
    );
    let e = parse(&text).expect_err("Alice and alice");
    assert!(e.contains("`Alice` and `alice` differ only in case"), "{e}");
}

/// The engine's instance pool holds every tenant's `concurrency` together, up to
/// `MAX_INVOCATIONS`; a policy past that is refused, saying so.
#[test]
fn tenants_whose_concurrency_adds_up_past_the_pool_are_refused() {
    let most = hapi_host::policy::MAX_INVOCATIONS;
    let tenants = |n: usize| {
        let mut text = with_tenant("");
        for t in 0..n {
            text.push_str(&format!(
                "\n[tenants.t{t}]\ntoken_sha256 = \"{}\"\nconcurrency = 64\n",
                hash_token(&format!("t{t}"))
            ));
        }
        text
    };
    // Alice's default 4, and 63 tenants of 64: 4,036; one more passes 4,096.
    let fits = parse(&tenants(most / 64 - 1)).expect("within the pool");
    assert_eq!(fits.invocations(), 4 + (most / 64 - 1) * 64);
    let e = parse(&tenants(most / 64)).expect_err("past the pool");
    assert!(
        e.contains(&format!("adds up to {}", 4 + most)) && e.contains("at most 4096 invocations"),
        "{e}"
    );
}

#[test]
fn the_example_policy_parses_and_its_token_matches() {
    let path = hapi_tests::workspace().join("examples/policy.toml");
    let p = Policy::load(&path).expect("examples/policy.toml");
    let demo = &p.tenants["demo"];
    assert!(
        p.tenant_by_token_hash(&hapi_host::policy::token_digest("demo-token"))
            .is_some()
    );
    assert_eq!(demo.limits.memory, 512 << 20);
    assert!(demo.functions.contains_key("feature-extract"));
}

#[test]
fn values_outside_their_ranges_are_named_with_key_and_line() {
    let host =
        |extra: &str| format!("[host]\nstore = \"s\"\nmodels = \"m\"\nstate = \"x\"\n{extra}\n");
    for (extra, needle) in [
        (
            "batch_window = \"1h\"",
            "host.batch_window: must be 0ns..=100ms",
        ),
        ("batch_window = \"100ms\"", ""),
        (
            "memory_budget = \"0\"",
            "host.memory_budget: must be 16MiB..",
        ),
        ("memory_budget = \"16MiB\"", ""),
        (
            "max_request = \"0\"",
            "host.max_request: must be 64KiB..=1GiB",
        ),
        ("max_batch = 0", "host.max_batch = 0: must be 1..=4096"),
        ("slice = \"1ms\"", "host.slice: must be 5ms..=2s"),
        ("batch_time = \"3s\"", "host.batch_time: must be 5ms..=2s"),
        (
            "max_connections = 0",
            "host.max_connections = 0: must be 1..=65536",
        ),
        (
            "max_connections_per_client = 11\nmax_connections = 10",
            "host.max_connections_per_client = 11: must be 1..=10",
        ),
        (
            "header_timeout = \"0ms\"",
            "host.header_timeout: must be 100ms..=3600s",
        ),
        ("workers = 0", "host.workers = 0: must be 1..=256"),
        (
            "operator_token_sha256 = \"xyz\"",
            "host.operator_token_sha256: expected 64 hex digits",
        ),
        ("metrics_listen = \"nowhere\"", "host.metrics_listen"),
    ] {
        let r = parse(&host(extra));
        if needle.is_empty() {
            assert!(r.is_ok(), "{extra}: {r:?}");
        } else {
            let e = r.expect_err(extra);
            assert!(e.contains("policy.toml line 5"), "{extra}: {e}");
            assert!(e.contains(needle), "{extra}: {e}");
        }
    }
    for (extra, needle) in [
        (
            "max_output = \"0\"",
            "tenants.alice.max_output: must be 1KiB..=4GiB",
        ),
        (
            "max_object = \"0\"",
            "tenants.alice.max_object: must be 1B..",
        ),
        ("max_read = \"0\"", "tenants.alice.max_read: must be 1B.."),
        (
            "timeout = \"0ms\"",
            "tenants.alice.timeout: must be 1ms..=3600s",
        ),
        (
            "max_functions = -1",
            "tenants.alice.max_functions = -1: must be 0..=1024",
        ),
        (
            "max_function_bytes = \"5GiB\"",
            "tenants.alice.max_function_bytes: must be 0B..=4GiB",
        ),
        ("weight = 0", "tenants.alice.weight = 0: must be 1..=1000"),
        (
            "compile_share = 0",
            "tenants.alice.compile_share = 0: must be 1..=100",
        ),
        (
            "compile_burst = \"2h\"",
            "tenants.alice.compile_burst: must be 1ms..=3600s",
        ),
    ] {
        let e = parse(&with_tenant(extra)).expect_err(extra);
        assert!(e.contains("policy.toml line 8"), "{extra}: {e}");
        assert!(e.contains(needle), "{extra}: {e}");
    }
}

#[test]
fn a_model_that_no_package_has_is_named_with_its_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let models = hapi_model::models_dir();
    let text = format!(
        "[host]\nstore = \"s\"\nmodels = \"{}\"\nstate = \"x\"\n\n[tenants.alice]\ntoken_sha256 = \"{}\"\nmodels = [\"resnet18\",\n  \"resnet19\"]\n",
        models.display(),
        hash_token("t")
    );
    let path = dir.path().join("p.toml");
    std::fs::write(&path, &text).expect("write");
    let e = Policy::load(&path).expect_err("unknown model").to_string();
    assert!(e.contains("line 9"), "{e}");
    assert!(e.contains("no model package `resnet19`"), "{e}");
    assert!(e.contains("resnet18"), "lists what there is: {e}");
    std::fs::write(&path, text.replace("resnet19", "vgg11")).expect("write");
    assert!(Policy::load(&path).is_ok());
    // A models directory that cannot be read is named.
    std::fs::write(
        &path,
        text.replace(&models.display().to_string(), "/nonexistent"),
    )
    .expect("write");
    let e = Policy::load(&path).expect_err("no models").to_string();
    assert!(e.contains("host.models: /nonexistent"), "{e}");
}

#[test]
fn model_directories_and_private_models_are_checked() {
    let dir = tempfile::tempdir().expect("tmp");
    let models = hapi_model::models_dir();
    // A second directory holding another package named `resnet18`, and one named `mine`.
    let (extra, private) = (dir.path().join("extra"), dir.path().join("alice"));
    std::fs::create_dir_all(&extra).expect("mkdir");
    std::fs::create_dir_all(&private).expect("mkdir");
    std::os::unix::fs::symlink(models.join("resnet18"), extra.join("copy")).expect("link");
    std::os::unix::fs::symlink(models.join("resnet18"), private.join("r18")).expect("link");
    let policy = |host_models: &str, tenant: &str| {
        format!(
            "[host]\nstore = \"s\"\nmodels = {host_models}\nstate = \"x\"\n\n[tenants.alice]\ntoken_sha256 = \"{}\"\n{tenant}\n",
            hash_token("t")
        )
    };
    let path = dir.path().join("p.toml");
    let load = |text: String| {
        std::fs::write(&path, text).expect("write");
        Policy::load(&path).map_err(|e| e.to_string())
    };
    let m = format!("\"{}\"", models.display());
    let both = format!("[{m}, \"{}\"]", extra.display());
    let e = load(policy(&both, "")).expect_err("one name, two packages");
    assert!(
        e.contains("host.models: two packages are named `resnet18`"),
        "{e}"
    );
    assert!(e.contains(&extra.join("copy").display().to_string()), "{e}");
    for (value, needle) in [
        ("[]", "host.models: the list is empty"),
        (
            "[1]",
            "host.models: expected a directory or a list of directories, got a integer",
        ),
        (&format!("[{m}, {m}]") as &str, "is listed twice"),
    ] {
        let e = load(policy(value, "")).expect_err(value);
        assert!(e.contains(needle), "{value}: {e}");
        assert!(e.contains("line 3"), "{value}: {e}");
    }
    // Private packages: a name that means a granted shared model too is refused with its line;
    // ungranted, the private one is the tenant's.
    let mine = format!("private_models = \"{}\"", private.display());
    let e = load(policy(&m, &format!("models = [\"resnet18\"]\n{mine}"))).expect_err("clash");
    assert!(e.contains("line 9"), "{e}");
    assert!(
        e.contains("tenants.alice.private_models: package `resnet18`")
            && e.contains("has the name of a shared model in tenants.alice.models"),
        "{e}"
    );
    let p = load(policy(&m, &format!("models = [\"vgg11\"]\n{mine}"))).expect("no clash");
    assert_eq!(
        p.tenants["alice"].private_models,
        std::slice::from_ref(&private)
    );
    let e = load(policy(&m, "private_models = [\"/nonexistent\"]")).expect_err("missing");
    assert!(
        e.contains("tenants.alice.private_models: /nonexistent"),
        "{e}"
    );
}

/// The host's own directories are outside a local store (a grant on the bucket of that name
/// would read every tenant's uploaded code, or a tenant's private weights), also through a
/// symbolic link or `..`, and do not hold it. They were accepted. Tenants may share a private
/// directory.
#[test]
fn the_hosts_directories_are_outside_the_store() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(dir.path().join("store/inner")).expect("mkdir");
    std::os::unix::fs::symlink(dir.path().join("store/inner"), dir.path().join("link"))
        .expect("link");
    let policy = |host: &str, tenants: &str| {
        let text = format!(
            "[host]\nstore = \"store\"\n{host}\n\n[tenants.alice]\ntoken_sha256 = \"{}\"\n{tenants}\n",
            hash_token("a")
        );
        Policy::parse("p.toml", &text, dir.path()).map_err(|e| e.to_string())
    };
    for (host, needle) in [
        ("state = \"store/state\"", "host.state = "),
        ("state = \"elsewhere/../store/x\"", "host.state = "),
        ("state = \"link/state\"", "host.state = "),
        // `link/..` is `store`, where the link leads.
        ("state = \"link/../state\"", "host.state = "),
        ("state = \"x\"\nmodels = \"store/models\"", "host.models = "),
    ] {
        let host = if host.contains("models") {
            host.to_string()
        } else {
            format!("models = \"models\"\n{host}")
        };
        let e = policy(&host, "").expect_err(&host);
        assert!(e.contains(needle), "{host}: {e}");
        assert!(e.contains("is inside host.store"), "{host}: {e}");
        assert!(e.contains("line 4"), "{host}: {e}");
    }
    // Nor around it: a grant on a bucket would read one of their directories (a state
    // directory's `functions`, say). Accepted before.
    for (host, needle) in [
        ("models = \"models\"\nstate = \".\"", "host.state = "),
        ("models = \".\"\nstate = \"x\"", "host.models = "),
    ] {
        let e = policy(host, "").expect_err(host);
        assert!(e.contains(needle), "{host}: {e}");
        assert!(e.contains("holds host.store"), "{host}: {e}");
    }
    let outside = "models = \"models\"\nstate = \"x\"";
    let e = policy(outside, "private_models = \".\"").expect_err("private around");
    assert!(
        e.contains("tenants.alice.private_models = ") && e.contains("holds host.store"),
        "{e}"
    );
    let e = policy(outside, "private_models = \"store/alice\"").expect_err("private");
    assert!(
        e.contains("tenants.alice.private_models = ") && e.contains("is inside host.store"),
        "{e}"
    );
    policy(outside, "private_models = \"alice\"").expect("outside the store");
    let shared = format!(
        "private_models = \"team\"\n\n[tenants.bob]\ntoken_sha256 = \"{}\"\nprivate_models = \"team\"",
        hash_token("b")
    );
    policy(outside, &shared).expect("a private directory two tenants share");
}

/// A tenant's `private_models` may not be a `host.models` directory, also through a link: every
/// shared package would have been its own (`alice/<name>`), whatever its `models` list granted.
#[test]
fn a_private_models_directory_is_not_a_shared_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let models = hapi_model::models_dir();
    std::os::unix::fs::symlink(&models, dir.path().join("link")).expect("link");
    std::fs::create_dir_all(dir.path().join("store")).expect("mkdir");
    let policy = |tenant: &str| {
        let text = format!(
            "[host]\nstore = \"store\"\nmodels = \"{}\"\nstate = \"x\"\n\n[tenants.alice]\ntoken_sha256 = \"{}\"\n{tenant}\n",
            models.display(),
            hash_token("a")
        );
        Policy::parse("p.toml", &text, dir.path()).map_err(|e| e.to_string())
    };
    for value in [models.display().to_string(), "link".into(), "link/.".into()] {
        let e = policy(&format!("private_models = \"{value}\"")).expect_err(&value);
        assert!(
            e.contains("tenants.alice.private_models = ")
                && e.contains("is a host.models directory"),
            "{value}: {e}"
        );
        assert!(e.contains("line 8"), "{value}: {e}");
    }
    // Above or below it, no package of the one is one level down in the other.
    let parent = models.parent().expect("parent").display().to_string();
    policy(&format!("private_models = \"{parent}\"")).expect("above");
    std::fs::create_dir_all(dir.path().join("mine")).expect("mkdir");
    policy("private_models = \"mine\"").expect("its own");
}

/// The metrics listener's connections come out of those the open-file limit leaves (the API
/// listener has that many fewer when both do not fit): each listener had them all, so together
/// they could hold twice as many, and the host's own files then failed to open for every
/// tenant. Where both fit, the API listener keeps its `max_connections`.
#[test]
fn the_metrics_listeners_connections_are_taken_from_the_hosts() {
    use hapi_host::policy::{HttpSettings, METRICS_CONNECTIONS};
    for usable in [1, 2, 3, 20, 1000, 65_536] {
        let mut main = HttpSettings {
            max_connections: 65_536,
            max_connections_per_client: 65_536,
            ..HttpSettings::default()
        };
        let metrics = main.split_for_metrics(usable);
        assert!(metrics.max_connections <= METRICS_CONNECTIONS, "{usable}");
        assert!(
            main.max_connections >= 1 && metrics.max_connections >= 1,
            "{usable}"
        );
        if usable >= 2 {
            assert!(
                main.max_connections + metrics.max_connections <= usable,
                "{usable}"
            );
        }
        assert!(main.max_connections_per_client <= main.max_connections);
        assert!(metrics.max_connections_per_client <= metrics.max_connections);
    }
    let mut main = HttpSettings {
        max_connections: 100,
        ..HttpSettings::default()
    };
    let metrics = main.split_for_metrics(usize::MAX);
    assert_eq!(
        (main.max_connections, metrics.max_connections),
        (100, METRICS_CONNECTIONS)
    );
}

#[test]
fn the_shutdown_timeout_covers_the_longest_tenant_timeout_and_body_unless_set() {
    let two = |host_extra: &str| {
        format!(
            "[host]\nstore = \"store\"\nmodels = \"models\"\nstate = \"state\"\n{host_extra}\n\n\
             [tenants.a]\ntoken_sha256 = \"{}\"\ntimeout = \"2m\"\n\n\
             [tenants.b]\ntoken_sha256 = \"{}\"\ntimeout = \"5s\"\n",
            hash_token("a"),
            hash_token("b")
        )
    };
    let shutdown = |host_extra: &str| {
        let p = parse(&two(host_extra)).expect("valid");
        p.host.http.shutdown_timeout
    };
    let secs = std::time::Duration::from_secs;
    assert_eq!(shutdown(""), secs(150));
    // An upload's body may take longer than any invocation.
    assert_eq!(shutdown("body_timeout = \"5m\""), secs(330));
    assert_eq!(shutdown("shutdown_timeout = \"10s\""), secs(10));
    let err = parse(&two("shutdown_timeout = \"0s\"")).expect_err("out of range");
    assert!(
        err.contains("host.shutdown_timeout") && err.contains("line 5"),
        "{err}"
    );
}
