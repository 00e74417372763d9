//! `cargo xtask layout`: the module graph of a crate's `src/`, and its cycles.
//!
//! A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`; `lib.rs`/`main.rs` is the crate).
//! Module `m` depends on `n` when `m`'s file names a path into `n`: `crate::n::...`, `super::`
//! (resolved from `m`), in `use` lists and in code alike. A path resolves to the deepest module
//! it names, so `crate::device::DeviceError` is a dependency on `device` (its `mod.rs`, which
//! re-exports it), and `crate::device::budget::Pin` on `device::budget`. Declaring a child
//! (`mod x;`) is not a dependency. A cycle is a strongly connected set of two or more modules:
//! two modules that import each other, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`device::budget`; the crate root is empty) of a file under `src`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    Some(parts.join("::"))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `text` without its `#[cfg(test)]` modules: tests are not part of the layout (and their
/// `super::` is the file's own module).
fn without_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let Some(open) = after.find('{') else {
            rest = "";
            break;
        };
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Text with comments and string literals blanked out, so that paths in docs or messages do
/// not count.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every path (`a::b::c`, and each branch of `a::{b, c::d}`) in `code`, as segment lists: those
/// that start at `crate::` or `super::`, and those that start at a name (a child module's, an
/// extern crate's: [`resolve`] keeps the child modules').
fn paths(code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_end = (i..b.len()).find(|&j| !is_ident(b[j])).unwrap_or(b.len());
        let starts = word_end > i
            && b[word_end..].starts_with(b"::")
            && (i == 0 || !is_ident(b[i - 1]) && b[i - 1] != b':');
        if !starts {
            i += 1;
            continue;
        }
        let (path, end) = parse_path(b, i);
        out.extend(path);
        i = end.max(i + 1);
    }
    out
}

/// Parses a path at `i`, expanding one level of braces; returns the paths and where it ended.
fn parse_path(b: &[u8], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut segs: Vec<String> = Vec::new();
    loop {
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if i > start {
            segs.push(String::from_utf8_lossy(&b[start..i]).into_owned());
        }
        if b[i..].starts_with(b"::") {
            i += 2;
            if b.get(i) == Some(&b'{') {
                // A group: each item is a path of its own, prefixed.
                let mut depth = 0;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                let inner = String::from_utf8_lossy(&b[i + 1..j.min(b.len())]).into_owned();
                let mut out = Vec::new();
                for item in split_top(&inner) {
                    let item: String = item.split_whitespace().next().unwrap_or("").to_string();
                    let mut p = segs.clone();
                    p.extend(
                        item.split("::")
                            .filter(|s| !s.is_empty() && *s != "*" && *s != "self")
                            .map(|s| {
                                s.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
                                    .to_string()
                            })
                            .filter(|s| !s.is_empty()),
                    );
                    out.push(p);
                }
                return (out, j + 1);
            }
            continue;
        }
        return (vec![segs], i);
    }
}

/// Splits a brace group's items at top-level commas.
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// The deepest module of `modules` that `path` (with `crate`/`super` resolved from `from`)
/// names.
fn resolve(path: &[String], from: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut base: Vec<String> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").map(str::to_string).collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some("self") => rest = &rest[1..],
        // A name: a child module of `from`, or something else (an extern crate, a type).
        Some(_) => {}
        None => return None,
    }
    let relative = !matches!(
        path.first().map(String::as_str),
        Some("crate" | "super" | "self")
    );
    let mut best = base.join("::");
    let mut cur = base;
    if relative {
        // Only a child module's name counts; `std::`, `tokio::`, `Type::` do not.
        let first = rest.first()?;
        let mut child = cur.clone();
        child.push(first.clone());
        if !modules.contains(&child.join("::")) {
            return None;
        }
    }
    for seg in rest {
        cur.push(seg.clone());
        let name = cur.join("::");
        if modules.contains(&name) {
            best = name;
        } else {
            break;
        }
    }
    modules.contains(&best).then_some(best)
}

/// Strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.g.get(v) {
            for w in ws {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The module graph of the crate under `src`.
pub fn graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut all = Vec::new();
    files(src, &mut all).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut texts = BTreeMap::new();
    for f in &all {
        // Binaries are crates of their own; `main.rs` beside `lib.rs` is not a module of it.
        if f.file_name().is_some_and(|n| n == "main.rs") && src.join("lib.rs").exists() {
            continue;
        }
        if let Some(m) = module_of(src, f) {
            let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            texts.insert(m, code_only(&without_tests(&text)));
        }
    }
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in &texts {
        let deps = graph.entry(m.clone()).or_default();
        for p in paths(code) {
            if let Some(target) = resolve(&p, m, &modules)
                && &target != m
            {
                deps.insert(target);
            }
        }
    }
    Ok(graph)
}

/// `cargo xtask layout [crate-dir]`: prints the module graph of `host/src` (or the given
/// crate) and fails if it has a cycle.
pub fn run(workspace: &Path, args: &[String]) -> Result<(), String> {
    let dir = args
        .first()
        .map_or_else(|| workspace.join("host"), |a| workspace.join(a));
    let src = dir.join("src");
    let graph = graph(&src)?;
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    for (m, deps) in &graph {
        let name = if m.is_empty() { "(crate)" } else { m.as_str() };
        let deps: Vec<&str> = deps
            .iter()
            .map(|d| if d.is_empty() { "(crate)" } else { d.as_str() })
            .collect();
        println!("{name} -> {}", deps.join(", "));
    }
    let found = cycles(&graph);
    println!(
        "{}: {} modules, {edges} dependencies, {} cycles",
        src.display(),
        graph.len(),
        found.len()
    );
    if found.is_empty() {
        Ok(())
    } else {
        let list: Vec<String> = found.iter().map(|c| c.join(" <-> ")).collect();
        Err(format!(
            "import cycles in {}: {}",
            src.display(),
            list.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry((*a).into()).or_default().insert((*b).into());
            g.entry((*b).into()).or_default();
        }
        g
    }

    #[test]
    fn cycles_are_found_and_chains_are_not() {
        assert!(cycles(&g(&[("a", "b"), ("b", "c")])).is_empty());
        assert_eq!(
            cycles(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
            vec![vec!["a".to_string(), "b".into(), "c".into()]]
        );
    }

    #[test]
    fn paths_resolve_to_the_deepest_module() {
        let modules: BTreeSet<String> = ["", "device", "device::budget", "policy", "policy::parse"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let code = code_only(
            "use crate::device::{budget::Pin, DeviceError};\n// crate::policy in a comment\nfn f() { super::Policy::load(\"crate::device\"); crate::Host; }",
        );
        let found: BTreeSet<String> = paths(&code)
            .iter()
            .filter_map(|p| resolve(p, "policy::parse", &modules))
            .collect();
        let want: BTreeSet<String> = ["device::budget", "device", "policy", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(found, want);
    }
}
