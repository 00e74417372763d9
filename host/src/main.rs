//! `hapi-host`: serve the storage tier from a policy file.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hapi_host::policy::{Policy, hash_token};
use hapi_host::{Host, api};
use std::path::PathBuf;

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
    /// Print the sha256 of a token, for a tenant's `token_sha256`.
    HashToken { token: String },
    /// Check a policy file and print its tenants.
    Check {
        #[arg(long)]
        policy: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
            for t in p.tenants.values() {
                println!(
                    "{}: {} grant(s), models {:?}, limits {:?}",
                    t.name,
                    t.grants.len(),
                    t.models,
                    t.limits
                );
            }
        }
        Command::Serve {
            policy: path,
            listen,
        } => {
            let policy = Policy::load(&path)?;
            let addr = listen.unwrap_or(policy.host.listen);
            // Bind first: a host that cannot listen fails before loading anything.
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            let host = tokio::task::spawn_blocking(move || Host::start(policy)).await??;
            // Tests and scripts read the bound address from this line.
            println!("listening on http://{}", listener.local_addr()?);
            let reloader = std::sync::Arc::clone(&host);
            tokio::spawn(async move {
                let Ok(mut hup) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                else {
                    return;
                };
                while hup.recv().await.is_some() {
                    let host = std::sync::Arc::clone(&reloader);
                    let path = path.clone();
                    let result = tokio::task::spawn_blocking(move || {
                        Policy::load(&path)
                            .map_err(anyhow::Error::from)
                            .and_then(|p| host.reload(p))
                    })
                    .await;
                    match result {
                        Ok(Ok(())) => tracing::info!("policy reloaded"),
                        Ok(Err(e)) => {
                            tracing::error!("policy not reloaded, keeping the old one: {e:#}")
                        }
                        Err(e) => tracing::error!("policy reload failed: {e}"),
                    }
                }
            });
            axum::serve(listener, api::router(host))
                .with_graceful_shutdown(shutdown())
                .await?;
            tracing::info!("stopped");
        }
    }
    Ok(())
}

async fn shutdown() {
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
