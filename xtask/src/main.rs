//! `cargo xtask`: the project's tasks.
//!
//! Every command first runs `setup`, which installs whatever is missing (Wasm target, libtorch,
//! the exporter's Python tools, Fashion-MNIST, model packages) into a cache outside the clone,
//! so that a fresh clone on a warm machine is ready in seconds.

mod cluster;
mod features;
mod jobs;
mod layout;
mod newfn;
mod scale;
mod setup;
mod sh;
mod sweep;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  setup [--cargo-component]
                     install what is missing (idempotent); prints where things are;
                     --cargo-component also installs cargo-component into the cache
  test [--no-lint]   setup, build the guests, run fmt/clippy and every test
  bench models       per-layer forward time and output bytes of every model package
                     (table on stdout, JSON in target/bench/models.json)
  bench host         one invocation's cost: empty pushdown, Wasm vs native extraction,
                     HTTP latency breakdown (table, JSON in target/bench/host.json);
                     --decode-against A.wasm also times another decode-bench build in the
                     same rounds (this build / A); --decode-rounds N (default 9)
  bench pooling      the device shared by 1-16 tenants: samples/s and latency with
                     pooling on and off, fairness under a flood, a burst past the queue
                     (tables, JSON and SVG in target/bench/pooling.{json,svg})
  demo               the quick start's job: Fashion-MNIST in the local store, hapi-host, and
                     hapi-train on EfficientNet-Lite0 with --split auto, then --split none,
                     side by side (options: --train-limit N, --test-limit N, --epochs N)
  eval-split [--full | --drift] [--models A,B] [--batches N,M] [--bandwidths MBIT,MBIT]
                     split choice against every split: storage and compute tiers in two
                     network namespaces over a tc-shaped veth pair, one core each (needs
                     root); table, target/eval-split/summary.json and split-choice.svg;
                     --drift: only EfficientNet-Lite0 at 50 and 1000 Mbit/s, then the
                     drift case (the link 1000 -> 50 -> 1000 Mbit/s under --split auto,
                     then under each bandwidth's best fixed split); --models, --batches,
                     --bandwidths: only those cases of the grid (default or --full), no
                     drift case
  cluster up [--nodes N] [--link MBIT] [--fashion-mnist] | cluster down
                     a storage tier of N nodes (default 3) in network namespaces: SeaweedFS
                     master, filer and S3 on a metadata node, a volume server and a hapi-host
                     on each storage node (replication 001), a compute node; each link
                     tc-shaped to MBIT; left running (needs root); prints the URLs
  eval-scale [--nodes N] [--link MBIT] [--samples N] [--model M] [--split S] [--compute-link-gbit G]
                     the trainer pulling features through 1..N storage nodes (default 4),
                     each behind its own MBIT link (default 16): samples/s, scaling
                     efficiency, bytes on the links, and a bottleneck model for 10, 100 and
                     1,000 nodes (needs root; table, target/eval-scale/summary.json and
                     scaling.svg)
  eval-sweep [--model M] [--train-limit N] [--test-limit N] [--epochs N] [--lrs A,B,..]
                     a sweep of heads (learning rates) through the feature store: job 1
                     extracts, the others train from the store, each checked against the
                     same job without it (table, target/eval-sweep/summary.json)
  eval-dtype [--model M] [--train-limit N] [--test-limit N] [--epochs N]
                     the same linear probe with features sent as f32, f16, bf16 and int8: bytes
                     per sample and test accuracy (table, target/eval-dtype/summary.json)
  layout [crate]     the module graph of host/src (or the crate's src/); fails on an import
                     cycle (part of `test`, for host/ and compute/)
  features           every package builds tch and its dependencies with the workspace's
                     features, so `cargo run -p <any>` does not rebuild them (part of `test`)
  soak [--tenants N] [--minutes M] [--quiet-neighbours]
                     well-behaved tenants in closed loops beside hostile ones against one
                     hapi-host: 5xx count, per-tenant p50/p99 against solo, resident set over
                     time (table, target/bench/soak.json); --quiet-neighbours: the same
                     well-behaved load with the hostile tenants silent (soak-quiet.json)
  new-function <NAME> [--dir DIR]
                     a new pushdown function from the template: a crate of its own with the
                     WIT beside it, building with `cargo build` or `cargo component build`
  env                print the environment (LIBTORCH, HAPI_MODELS, ...) as shell exports

environment:
  HAPI_CACHE         cache directory (default ~/.cache/hapi-rs)
  HAPI_DEVICE        cpu | cuda (default: cuda when `nvidia-smi` finds a GPU)
  HAPI_MODELS_ONLY   comma-separated model names to export (default: all)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let started = Instant::now();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup(&args[1..]),
        Some("env") => setup::run().map(|env| env.print_exports()),
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("demo") => jobs::demo(&args[1..]),
        Some("eval-split") => jobs::eval_split(&args[1..]),
        Some("cluster") => cluster::run(&args[1..]),
        Some("eval-scale") => scale::run(&args[1..]),
        Some("eval-sweep") => sweep::run(&args[1..]),
        Some("eval-dtype") => sweep::dtype(&args[1..]),
        Some("new-function") => setup::workspace().and_then(|w| newfn::run(&w, &args[1..])),
        Some("layout") => setup::workspace().and_then(|w| layout::run(&w, &args[1..])),
        Some("features") => setup::workspace().and_then(|w| features::run(&w)),
        Some("soak") => soak(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => {
            eprintln!("xtask: done in {:.1}s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn setup(args: &[String]) -> Result<(), String> {
    let tools = args.iter().any(|a| a == "--cargo-component");
    if let Some(bad) = args.iter().find(|a| *a != "--cargo-component") {
        return Err(format!("unknown option `{bad}` for `setup`"));
    }
    let env = setup::run()?;
    env.print_summary();
    if tools {
        let bin = setup::cargo_component(&env)?;
        println!("cargo-component {}", bin.join("cargo-component").display());
        println!("(`source <(cargo xtask env)` puts it on PATH for `cargo component`)");
    }
    Ok(())
}

fn test(args: &[String]) -> Result<(), String> {
    let lint = !args.iter().any(|a| a == "--no-lint");
    if let Some(bad) = args.iter().find(|a| *a != "--no-lint") {
        return Err(format!("unknown option `{bad}` for `test`"));
    }
    let env = setup::run()?;
    env.build_guests()?;
    let guests = env.workspace.join("guest-fns");
    if lint {
        sh::step("module layout (no import cycles)");
        layout::run(&env.workspace, &[])?;
        layout::run(&env.workspace, &["compute".to_string()])?;
        sh::step("torch crates alike for every package");
        features::run(&env.workspace)?;
        sh::step("cargo fmt --check");
        env.cargo(&["fmt", "--all", "--check"])?;
        sh::step("cargo clippy");
        env.cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])?;
        env.cargo_in(&guests, &["fmt", "--all", "--check"])?;
        env.cargo_in(&guests, &["clippy", "--release", "--", "-D", "warnings"])?;
    }
    sh::step("cargo test");
    // The tests' hosts give libtorch every core for each operator, as libtorch does by
    // default: a host gives each device batch cores / device_workers threads
    // (`share_cores`, one each on a CPU by default), and the tests, which mostly run one call
    // at a time, took 1.5-3.5x as long with one thread. `share_cores` leaves a set
    // `OMP_NUM_THREADS` alone; the tests of `share_cores` itself remove it from the hosts they
    // start. One that the caller set stands (an empty one counts as unset, as there).
    let mut extra = Vec::new();
    if std::env::var_os("OMP_NUM_THREADS").is_none_or(|v| v.is_empty()) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        extra.push(("OMP_NUM_THREADS", cores.to_string()));
    }
    env.cargo_with(&env.workspace, &["test", "--workspace"], &extra)?;
    Ok(())
}

fn soak(args: &[String]) -> Result<(), String> {
    host_bench("soak", args)
}

/// Runs `hapi-host`'s bench `name` (after building the guests) with `--out target/bench` and
/// `args`.
fn host_bench(name: &str, args: &[String]) -> Result<(), String> {
    let env = setup::run()?;
    env.build_guests()?;
    let out = env.workspace.join("target/bench");
    let out = out.to_string_lossy().into_owned();
    let mut cmd = vec![
        "bench",
        "--package",
        "hapi-host",
        "--bench",
        name,
        "--",
        "--out",
        &out,
    ];
    cmd.extend(args.iter().map(String::as_str));
    env.cargo(&cmd)
}

fn bench(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("models") => {
            let env = setup::run()?;
            let out = env.workspace.join("target/bench");
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            let json: PathBuf = out.join("models.json");
            let json = json.to_string_lossy().into_owned();
            let mut cmd = vec![
                "run",
                "--release",
                "--package",
                "hapi-model",
                "--bin",
                "hapi-model",
                "--",
                "bench",
                "--json",
                &json,
            ];
            cmd.extend(args[1..].iter().map(String::as_str));
            env.cargo(&cmd)
        }
        Some("host") => {
            let env = setup::run()?;
            env.build_guests()?;
            let json = env.workspace.join("target/bench/host.json");
            let json = json.to_string_lossy().into_owned();
            let mut cmd = vec![
                "bench",
                "--package",
                "hapi-host",
                "--bench",
                "host",
                "--",
                "--json",
                &json,
            ];
            cmd.extend(args[1..].iter().map(String::as_str));
            env.cargo(&cmd)
        }
        Some("pooling") => host_bench("pooling", &args[1..]),
        Some(other) => Err(format!(
            "unknown benchmark `{other}` (known: models, host, pooling)"
        )),
        None => Err("usage: cargo xtask bench models|host|pooling [options]".into()),
    }
}
