//! `cargo xtask features`: every package that builds the torch crates builds them exactly as
//! `cargo test --workspace` does.
//!
//! Cargo resolves features for the packages it is asked to build, so `cargo run -p hapi-train`
//! can enable fewer features on a dependency of `tch` or `torch-sys` (`libc`'s `extra_traits`, a
//! build script's `sha2`) than the whole workspace does. A dependency built with other features
//! has another hash, and so does everything above it: libtorch's bindings compiled again, a
//! minute or more each time one switches packages. `hapi-model`, which every torch user goes
//! through, asks for the workspace's features on those dependencies (its empty build script
//! makes its `[build-dependencies]` count); this check finds the ones it misses (after a
//! dependency update, say) and names them.
//!
//! What is compared is cargo's own unit graph (`--unit-graph`, the units a command would
//! compile, with their features, profiles and dependencies), not `cargo tree`: the tree lists
//! build dependencies of packages without a build script, which real builds leave out, and it
//! does not show that cargo shares one unit between the build side and the runtime side when
//! both resolve alike. `--unit-graph` is unstable; `RUSTC_BOOTSTRAP=1` lets the stable cargo
//! print it (nothing is compiled by these commands, so the setting reaches no artefact).

use crate::sh;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// The crate whose compiled unit must be the same whatever is built.
const ROOT: &str = "tch";

/// One unit as cargo hashes it: package, target, mode, features and profile (less the
/// profile's name: `test` and `dev` compile alike), and the same of every dependency.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Unit {
    /// `name@version target mode [features] opt-level debuginfo`, for messages.
    this: String,
    /// The whole profile, as cargo prints it.
    profile: String,
    deps: Vec<Unit>,
}

impl Unit {
    /// Every edge `unit -> dependency` in this one's closure (and the unit itself), for naming
    /// differences: the same crate can be built alike in two selections and still be linked
    /// to another unit of one of its dependencies.
    fn closure(&self, out: &mut BTreeSet<String>) {
        // Not cut short at a `this` already seen: two units alike but for their dependencies
        // print the same (the tree of `tch` is a few hundred units).
        out.insert(self.this.clone());
        for d in &self.deps {
            out.insert(format!("{} -> {}", self.this, d.this));
            d.closure(out);
        }
    }
}

/// The unit graph of `cargo <args> --unit-graph`.
fn unit_graph(workspace: &Path, args: &[&str]) -> Result<Value, String> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(args)
        .args(["-Z", "unstable-options", "--unit-graph"]);
    let out = sh::output(&mut cmd)?;
    serde_json::from_str(&out).map_err(|e| format!("`cargo {}`: unit graph: {e}", args.join(" ")))
}

/// The `ROOT` library units of a unit graph (none when the selection does not build it).
fn root_units(graph: &Value) -> Result<BTreeSet<Unit>, String> {
    let units = graph["units"]
        .as_array()
        .ok_or("the unit graph has no `units`")?;
    let mut memo: BTreeMap<usize, Unit> = BTreeMap::new();
    let mut roots = BTreeSet::new();
    for (i, u) in units.iter().enumerate() {
        let pkg = package(u);
        if pkg.starts_with(&format!("{ROOT}@"))
            && u["target"]["name"] == ROOT
            && u["mode"] == "build"
        {
            roots.insert(unit(units, i, &mut memo, 0)?);
        }
    }
    Ok(roots)
}

/// `name@version` of a unit (its `pkg_id` ends in `#name@version`, or `#version` for a
/// path package whose directory is its name).
fn package(u: &Value) -> String {
    let id = u["pkg_id"].as_str().unwrap_or_default();
    let tail = id.rsplit('#').next().unwrap_or(id);
    if tail.contains('@') {
        tail.to_string()
    } else {
        let name = id
            .rsplit('/')
            .next()
            .unwrap_or(id)
            .split('#')
            .next()
            .unwrap_or(id);
        format!("{name}@{tail}")
    }
}

fn unit(
    units: &[Value],
    i: usize,
    memo: &mut BTreeMap<usize, Unit>,
    depth: usize,
) -> Result<Unit, String> {
    if let Some(u) = memo.get(&i) {
        return Ok(u.clone());
    }
    if depth > 256 {
        return Err("the unit graph is deeper than 256 (a cycle?)".into());
    }
    let u = &units[i];
    let mut profile = u["profile"].clone();
    if let Some(p) = profile.as_object_mut() {
        p.remove("name");
    }
    let features: Vec<&str> = u["features"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let this = format!(
        "{} {} {} [{}] opt-level={} debuginfo={}",
        package(u),
        u["target"]["name"].as_str().unwrap_or_default(),
        u["mode"].as_str().unwrap_or_default(),
        features.join(","),
        profile["opt_level"],
        profile["debuginfo"]
    );
    let mut deps = Vec::new();
    for d in u["dependencies"].as_array().into_iter().flatten() {
        let j = d["index"]
            .as_u64()
            .ok_or("a unit dependency without an index")? as usize;
        if j >= units.len() {
            return Err(format!("unit dependency {j} out of range"));
        }
        deps.push(unit(units, j, memo, depth + 1)?);
    }
    deps.sort();
    let made = Unit {
        this,
        profile: profile.to_string(),
        deps,
    };
    memo.insert(i, made.clone());
    Ok(made)
}

fn listed(items: &[&str]) -> String {
    if items.is_empty() {
        "(nothing)".into()
    } else {
        items.join("\n    ")
    }
}

/// The workspace's members, by name.
fn members(workspace: &Path) -> Result<Vec<String>, String> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace)
        .args(["metadata", "--no-deps", "--format-version", "1"]);
    let meta: Value = serde_json::from_str(&sh::output(&mut cmd)?)
        .map_err(|e| format!("`cargo metadata`: {e}"))?;
    Ok(meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect())
}

pub fn run(workspace: &Path) -> Result<(), String> {
    // What CI builds: `cargo test --workspace`.
    let reference = ["test", "--workspace", "--no-run"];
    let whole = root_units(&unit_graph(workspace, &reference)?)?;
    if whole.is_empty() {
        return Err(format!(
            "`cargo {}` builds no `{ROOT}`",
            reference.join(" ")
        ));
    }
    let mut whole_closure = BTreeSet::new();
    for u in &whole {
        u.closure(&mut whole_closure);
    }
    let mut selections: Vec<Vec<String>> = vec![vec!["build".into(), "--workspace".into()]];
    for m in members(workspace)? {
        selections.push(vec!["build".into(), "-p".into(), m.clone()]);
        selections.push(vec!["test".into(), "-p".into(), m, "--no-run".into()]);
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    for args in &selections {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mine = root_units(&unit_graph(workspace, &args)?)?;
        if mine.is_empty() {
            continue; // does not build the torch crates
        }
        checked += 1;
        if mine.is_subset(&whole) {
            continue;
        }
        let mut mine_closure = BTreeSet::new();
        for u in &mine {
            u.closure(&mut mine_closure);
        }
        let missing: Vec<&str> = whole_closure
            .difference(&mine_closure)
            .map(String::as_str)
            .collect();
        let extra: Vec<&str> = mine_closure
            .difference(&whole_closure)
            .map(String::as_str)
            .collect();
        wrong.push(format!(
            "`cargo {}` compiles {ROOT} otherwise than `cargo {}`:\n  only there:\n    {}\n  only here:\n    {}",
            args.join(" "),
            reference.join(" "),
            listed(&missing),
            listed(&extra)
        ));
    }
    if wrong.is_empty() {
        println!(
            "{checked} package selections compile `{ROOT}` and its dependencies as `cargo {}` does",
            reference.join(" ")
        );
        Ok(())
    } else {
        Err(format!(
            "{}\nAsk for the workspace's features in model/Cargo.toml (build-side ones under [build-dependencies]).",
            wrong.join("\n")
        ))
    }
}
