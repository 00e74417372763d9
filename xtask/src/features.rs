//! `cargo xtask features`: every package that builds the torch crates builds them exactly as
//! `cargo build --workspace` does.
//!
//! Cargo resolves features for the packages it is asked to build, so `cargo run -p hapi-train`
//! can enable fewer features on a dependency of `tch` or `torch-sys` (`libc`'s `extra_traits`, a
//! build script's `typenum`) than the whole workspace does. A dependency built with other
//! features has another hash, and so does everything above it: libtorch's bindings compiled
//! again, minutes each time one switches packages. `hapi-model`, which every torch user goes
//! through, asks for the workspace's features on those dependencies; this check finds the ones
//! it misses (after a dependency update, say) and names them.

use crate::sh;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The crate whose dependencies must resolve alike.
const ROOT: &str = "tch";

/// `cargo tree` of `selection` with features, resolved as `cargo test` does (`dev`: with
/// dev-dependencies) or as `cargo build` and `cargo run` do.
fn tree(workspace: &Path, selection: &[&str], dev: bool) -> Result<String, String> {
    let edges = if dev {
        "normal,build,dev"
    } else {
        "normal,build"
    };
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace)
        .args(["tree", "--no-dedupe", "-e", edges, "-f", "{p} {f}"])
        .args(selection);
    sh::output(&mut cmd)
}

/// `name version features` of every crate under the first `ROOT` in `tree`, build-side ones
/// marked (a build script's dependency resolves apart from the same crate as a library's).
fn closure(tree: &str) -> Option<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let mut root_depth = None;
    let mut build_depth: Option<usize> = None;
    for line in tree.lines() {
        let item = line.trim_start_matches(['│', '├', '└', '─', ' ']);
        let depth = line.chars().count() - item.chars().count();
        if let Some(root) = root_depth {
            if item.is_empty() {
                continue;
            }
            if depth <= root && !item.starts_with('[') {
                break;
            }
            if build_depth.is_some_and(|b| depth < b) {
                build_depth = None;
            }
            if item.starts_with("[build-dependencies]") {
                build_depth = Some(depth);
                continue;
            }
            if item.starts_with('[') {
                continue;
            }
            let side = if build_depth.is_some() { "build " } else { "" };
            out.insert(format!("{side}{}", item.replace(" (*)", "")));
        } else if item.starts_with(&format!("{ROOT} v")) {
            root_depth = Some(depth);
            out.insert(item.to_string());
        }
    }
    root_depth.map(|_| out)
}

pub fn run(workspace: &Path) -> Result<(), String> {
    // What CI builds: `cargo test --workspace`.
    let whole = closure(&tree(workspace, &["--workspace"], true)?)
        .ok_or_else(|| format!("no `{ROOT}` in the workspace's dependency tree"))?;
    let members = tree(workspace, &["--workspace", "--depth", "0"], false)?;
    let here = format!("({}", workspace.display());
    let mut wrong = Vec::new();
    // Members are the roots: `name version (path)`, the path inside the workspace.
    let selections = std::iter::once(("--workspace", false)).chain(
        members
            .lines()
            .filter(|l| l.contains(&here))
            .filter_map(|l| l.split_whitespace().next())
            .flat_map(|m| [(m, false), (m, true)]),
    );
    for (member, dev) in selections {
        let args: &[&str] = if member == "--workspace" {
            &[member]
        } else {
            &["-p", member]
        };
        let Some(mine) = closure(&tree(workspace, args, dev)?) else {
            continue; // does not build the torch crates
        };
        let missing: Vec<&String> = whole.difference(&mine).collect();
        let extra: Vec<&String> = mine.difference(&whole).collect();
        if !missing.is_empty() || !extra.is_empty() {
            let command = format!(
                "cargo {} {}",
                if dev { "test" } else { "build" },
                args.join(" ")
            );
            wrong.push(format!(
                "`{command}` builds {ROOT}'s dependencies otherwise than `cargo test --workspace`:\n  workspace: {}\n  {command}: {}",
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; "),
                extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")
            ));
        }
    }
    if wrong.is_empty() {
        println!(
            "every package builds `{ROOT}` and its dependencies with the workspace's features"
        );
        Ok(())
    } else {
        Err(format!(
            "{}\nAsk for the workspace's features in model/Cargo.toml (build-side ones under [build-dependencies]).",
            wrong.join("\n")
        ))
    }
}
