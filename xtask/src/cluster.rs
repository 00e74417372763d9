//! `cargo xtask cluster up|down`: a storage tier of N nodes on this machine (network
//! namespaces; hapi_tests::cluster has the layout), left running for a job or an experiment.

use crate::jobs::{self, TOKEN};
use crate::setup::{self, Env};
use crate::sh;
use hapi_tests::cluster::{self, Cluster, Config, Network, XTASK};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A cluster of `nodes` serving the demo tenant (`models`, data under `prefix`), hosts reading
/// the replicas their volume servers hold, links unshaped.
pub(crate) fn demo_config(
    env: &Env,
    bins: &Path,
    network: Network,
    nodes: usize,
    dir: PathBuf,
    models: &str,
    prefix: &str,
) -> Result<Config, String> {
    Ok(Config {
        network,
        nodes,
        link_mbit: None,
        compute_link_mbit: None,
        dir,
        weed: env.weed.clone(),
        host_binary: bins.join("hapi-host"),
        host_env: env
            .vars()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        host_extra: format!("models = \"{}\"\ndevice = \"auto\"\n", env.models.display()),
        tenants: jobs::tenant(env, &jobs::token_hash(bins)?, models, prefix),
        locality: true,
    })
}

const USAGE: &str =
    "usage: cargo xtask cluster up [--nodes N] [--link MBIT] [--fashion-mnist] | down";

pub fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("up") => up(&args[1..]),
        Some("down") if args.len() == 1 => {
            let n = cluster::down(XTASK);
            println!("cluster down: {n} namespaces removed");
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}

fn up(args: &[String]) -> Result<(), String> {
    let mut nodes = 3usize;
    let mut link = None;
    let mut fashion = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{name} needs a value\n{USAGE}"))?;
            v.parse()
                .map_err(|_| format!("{name} {v}: not a whole number\n{USAGE}"))
        };
        match a.as_str() {
            "--nodes" => nodes = value("--nodes")? as usize,
            "--link" => {
                link = Some(u32::try_from(value("--link")?).map_err(|_| "--link: too large")?)
            }
            "--fashion-mnist" => fashion = true,
            other => return Err(format!("unknown option `{other}`\n{USAGE}")),
        }
    }
    if let Some(why) = cluster::unavailable() {
        return Err(format!("cluster up: {why}"));
    }
    let env = setup::run()?;
    let bins = jobs::build(&env)?;
    let dir = env.workspace.join(".hapi/cluster");
    let config = Config {
        link_mbit: link,
        compute_link_mbit: link,
        ..demo_config(
            &env,
            &bins,
            XTASK,
            nodes,
            dir.clone(),
            "\"efficientnet_lite0\", \"resnet18\", \"alexnet\"",
            "fashion-mnist",
        )?
    };
    sh::step(&format!(
        "{nodes} storage nodes, a metadata node and a compute node (links: {})",
        link.map_or("unshaped".into(), |m| format!("{m} Mbit/s"))
    ));
    let c = Cluster::start(&config)?;
    c.create_bucket("datasets")?;
    let hosts: Vec<String> = c.nodes.iter().map(|n| n.host_url.clone()).collect();
    let hosts_file = dir.join("hosts");
    std::fs::write(&hosts_file, hosts.join("\n") + "\n").map_err(|e| e.to_string())?;
    // What hapi-data and hapi-train need: the S3 gateway and the models (the trainer reads
    // their manifests).
    // The operator's credentials load data; the tenant's (read and list of `datasets`) train.
    let line = |vars: Vec<(&str, String)>| -> String {
        vars.iter()
            .map(|(k, v)| format!("{k}={v} "))
            .chain(std::iter::once(format!(
                "HAPI_MODELS={} ",
                env.models.display()
            )))
            .collect()
    };
    let (s3_env, tenant_env) = (line(c.s3_env()), line(c.tenant_s3_env()));
    if fashion {
        sh::step("Fashion-MNIST into s3://datasets/fashion-mnist");
        sh::run(
            Command::new(bins.join("hapi-data"))
                .args(["--store", "s3://", "--bucket", "datasets", "fashion-mnist"])
                .envs(env.vars())
                .envs(c.s3_env()),
        )?;
    }
    let train = bins.join("hapi-train");
    println!("cluster up: {nodes} storage nodes");
    println!("  S3 endpoint: {}", c.s3_endpoint());
    for (n, h) in c.nodes.iter().zip(&hosts) {
        println!("  host: {h} (namespace {})", n.namespace);
    }
    println!("  hosts file: {}", hosts_file.display());
    println!("  logs: {}", dir.join("logs").display());
    if !fashion {
        println!(
            "  load data: env {s3_env}{} --store s3:// --bucket datasets fashion-mnist",
            bins.join("hapi-data").display()
        );
    }
    println!(
        "  train on the compute node: ip netns exec {} env {tenant_env}{} --hosts-file {} --token {TOKEN} --store s3:// --bucket datasets --prefix fashion-mnist --split auto --locality",
        XTASK.compute(),
        train.display(),
        hosts_file.display()
    );
    println!("  stop: cargo xtask cluster down");
    c.detach();
    Ok(())
}
