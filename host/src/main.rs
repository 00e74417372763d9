//! `hapi-host`: serve the storage tier from a policy file.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hapi_host::http::server::Connections;
use hapi_host::policy::{Policy, hash_token};
use hapi_host::{Host, http};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the HTTP API. SIGHUP reloads the policy; SIGINT/SIGTERM finish in-flight work and stop.
    Serve {
        /// Operator policy file (TOML).
        #[arg(long)]
        policy: PathBuf,
        /// Override the policy's listen address (e.g. 127.0.0.1:0 for any free port).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Print the sha256 of a token, for a tenant's `token_sha256` or the operator's.
    HashToken { token: String },
    /// Check a policy file (every key, range and model package) and print its tenants.
    Check {
        #[arg(long)]
        policy: PathBuf,
    },
    /// Make and keep (in the state directory) the memory model of every model a tenant may use,
    /// on the policy's device: what `serve` would do before serving, done at install time.
    Measure {
        #[arg(long)]
        policy: PathBuf,
    },
}

/// Raises the soft limit on open files to the hard limit: every connection takes one.
fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: l.rlim_max,
                rlim_max: l.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
        l.rlim_cur
    }
}

/// Every few seconds, hands memory that invocations freed back to the kernel. Tenants'
/// allocations come and go in many sizes on many threads; without this, glibc keeps freed
/// pages in its arenas and the resident set creeps up over hours of mixed load (the more so
/// since the host keeps up to 64 MiB freed at the top of each heap between device batches:
/// `memory::rss::serving`). On a thread of
/// its own: trimming unmaps what it returns, which held one of the HTTP runtime's threads (and
/// the requests on it) while it ran.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_freed_memory() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("malloc-trim".into())
        .spawn(|| {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(5));
                // SAFETY: malloc_trim takes no pointers and is safe to call from any thread.
                unsafe {
                    libc::malloc_trim(0);
                }
            }
        })
        .map(drop)
}

/// A line on stdout, if anyone reads it.
fn said(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

async fn shutdown_signal() {
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing in-flight invocations");
}

/// When a stop began plus the `shutdown_timeout` in force then: the host's own work still in
/// progress at that instant (a compile, a reload, a measurement on the blocking pool) is not
/// waited for past it.
static STOP_BY: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(run());
    match STOP_BY.get() {
        Some(by) => rt.shutdown_timeout(by.saturating_duration_since(std::time::Instant::now())),
        None => drop(rt),
    }
    result
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HAPI_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::HashToken { token } => println!("{}", hash_token(&token)),
        Command::Check { policy } => {
            let p = Policy::load(&policy)?;
            let found =
                hapi_host::policy::packages::PolicyModels::read(&p).map_err(anyhow::Error::msg)?;
            for t in p.tenants.values() {
                let private: Vec<&String> = found
                    .private
                    .get(&t.name)
                    .map(|m| m.keys().collect())
                    .unwrap_or_default();
                println!(
                    "{}: {} grant(s), models {:?}, private models {:?}, limits {:?}",
                    t.name,
                    t.grants.len(),
                    t.models,
                    private,
                    t.limits
                );
            }
            let caps = p
                .tenants
                .values()
                .map(|t| (t.name.as_str(), t.limits.concurrency, t.limits.queue));
            for line in http::conns::cap_warnings(p.host.http.max_connections, caps) {
                eprintln!("{line}");
            }
        }
        Command::Measure { policy } => {
            let p = Policy::load(&policy)?;
            let device = hapi_model::device::parse(&p.host.device)?;
            // With the threads and the allocator `serve` gives the batches: the kept models are
            // found by the threads, and their times are the batches'.
            hapi_host::prepare_for_models(&p, device);
            let models =
                hapi_host::models::Models::open(&p, device, Some(p.host.state.join("memory")))?;
            let ids = models.usable(&p);
            models.measure_ahead(&ids);
            println!(
                "{} model(s) measured or already kept on {device:?} in {}",
                ids.len(),
                p.host.state.join("memory").display()
            );
        }
        Command::Serve {
            policy: path,
            listen,
        } => {
            // SIGHUP's handler first: until it is installed a SIGHUP ends the process (its
            // default action), and a service manager's reload while the host started (models
            // measured, uploads compiled: seconds to minutes) stopped it, as a clean exit that
            // `Restart=on-failure` does not restart. One received meanwhile reloads the policy
            // once the host is up.
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("installing the SIGHUP handler")?;
            let policy = Policy::load(&path)?;
            let mut http_settings = policy.host.http.clone();
            let files = raise_fd_limit();
            // Leave descriptors for the host itself (models, objects, compiled code).
            let usable = usize::try_from(files.saturating_sub(128)).unwrap_or(usize::MAX);
            if files > 0 && usable < http_settings.max_connections {
                tracing::warn!(
                    "the open-file limit is {files}: at most {usable} connections instead of {}",
                    http_settings.max_connections
                );
                http_settings.max_connections = usable.max(1);
                http_settings.max_connections_per_client =
                    http_settings.max_connections_per_client.min(usable.max(1));
            }
            let addr = listen.unwrap_or(policy.host.listen);
            // Bind first: a host that cannot listen fails before loading anything.
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            let metrics_listener = match policy.host.metrics_listen {
                Some(a) => Some(
                    tokio::net::TcpListener::bind(a)
                        .await
                        .with_context(|| format!("binding {a} (host.metrics_listen)"))?,
                ),
                None => None,
            };
            // The open-file limit's room for connections, both listeners together (unknown:
            // no bound).
            let room = if files > 0 { usable } else { usize::MAX };
            let metrics_settings = metrics_listener
                .is_some()
                .then(|| http_settings.split_for_metrics(room));
            let host = tokio::task::spawn_blocking(move || Host::start(policy)).await??;
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            return_freed_memory()?;
            // Tests and scripts read the bound address from this line.
            // Written, not printed: `println!` panics when stdout is gone (a reader that took
            // the first line and closed its pipe), which stopped the host.
            said(&format!("listening on http://{}", listener.local_addr()?));
            // The API's connections, which both listeners' `/metrics` report.
            let conns = Arc::new(Connections::default());
            if let (Some(l), Some(settings)) = (metrics_listener, metrics_settings) {
                said(&format!("metrics on http://{}", l.local_addr()?));
                let router = http::metrics_router(Arc::clone(&host), Arc::clone(&conns));
                tokio::spawn(http::serve(
                    l,
                    router,
                    settings,
                    Arc::new(Connections::default()),
                    std::future::pending(),
                ));
            }
            let reloader = Arc::clone(&host);
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    let host = Arc::clone(&reloader);
                    let path = path.clone();
                    let result = tokio::task::spawn_blocking(move || {
                        Policy::load(&path)
                            .map_err(|e| anyhow::Error::from(e).context("the old policy stays"))
                            .and_then(|p| host.reload(p))
                    })
                    .await;
                    match result {
                        Ok(Ok(restart)) if restart.is_empty() => tracing::info!("policy reloaded"),
                        Ok(Ok(restart)) => tracing::warn!(
                            "policy reloaded; these host settings changed and take effect at the next restart: {}",
                            restart.join(", ")
                        ),
                        Ok(Err(e)) => {
                            tracing::error!("policy not reloaded: {e:#}")
                        }
                        Err(e) => tracing::error!("policy reload failed: {e}"),
                    }
                }
            });
            http::serve(
                listener,
                http::router(Arc::clone(&host), Arc::clone(&conns)),
                http_settings,
                conns,
                async {
                    shutdown_signal().await;
                    // The policy in force at the stop (a reload changes it).
                    let drain = host.policy().host.http.shutdown_timeout;
                    let _ = STOP_BY.set(std::time::Instant::now() + drain);
                    drain
                },
            )
            .await;
            host.device().shutdown();
            tracing::info!("stopped");
        }
    }
    Ok(())
}
