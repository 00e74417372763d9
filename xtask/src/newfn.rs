//! `cargo xtask new-function <NAME> [--dir DIR]`: a new pushdown function from the template in
//! `xtask/templates/function/`: a crate of its own (its own workspace), the host's WIT copied
//! into `wit/` so that `wit-bindgen` and `cargo component` find it without a path into this
//! repository, a `.cargo/config.toml` that makes plain `cargo build` target wasm32-wasip2, and
//! the guests' `Cargo.lock` (the dependency versions this repository tests with).

use std::path::{Path, PathBuf};

const CARGO_TOML: &str = include_str!("../templates/function/Cargo.toml.in");
const CONFIG_TOML: &str = include_str!("../templates/function/cargo/config.toml.in");
const LIB_RS: &str = include_str!("../templates/function/lib.rs.in");
const README: &str = include_str!("../templates/function/README.md.in");
const GITIGNORE: &str = include_str!("../templates/function/gitignore.in");

/// A function name the host accepts (letters, digits, `-`, `_`; at most 64 bytes) that is also a
/// crate name: it starts with a lowercase letter.
fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a function name: lowercase letters, digits, `-` and `_`, starting \
             with a letter, at most 64 bytes"
        ))
    }
}

/// The crates the guests build from `vendor/` (patched for Wasm SIMD, vendor/README.md), with
/// the checksums of the releases they were vendored from. A generated function is a crate of
/// its own: it builds these releases from crates.io, so its `Cargo.lock` says so.
const VENDORED: [(&str, &str, &str); 3] = [
    (
        "png",
        "0.18.1",
        "60769b8b31b2a9f263dae2776c37b1b28ae246943cf719eb6946a1db05128a61",
    ),
    (
        "zune-core",
        "0.5.3",
        "d56377fd46368984a170bc5aac5567e52ca5da874caa60bea39fcbca78fb658b",
    ),
    (
        "zune-jpeg",
        "0.5.15",
        "27bc9d5b815bc103f142aa054f561d9187d191692ec7c2d1e2b4737f8dbd7296",
    ),
];

const CRATES_IO: &str = "registry+https://github.com/rust-lang/crates.io-index";

/// The guests' `Cargo.lock` with the vendored crates' entries (no source: a path) pointing at
/// crates.io's releases of the same versions again.
fn lock_for_crates_io(lock: &str) -> Result<String, String> {
    let mut out = String::with_capacity(lock.len() + 512);
    let mut lines = lock.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        let Some(name) = line
            .strip_prefix("name = \"")
            .and_then(|s| s.strip_suffix('"'))
        else {
            continue;
        };
        let Some((_, version, checksum)) = VENDORED.iter().find(|(n, ..)| *n == name) else {
            continue;
        };
        let locked = lines.next().unwrap_or_default();
        if locked != format!("version = \"{version}\"") {
            return Err(format!(
                "guest-fns/Cargo.lock: {name} has `{locked}`, but xtask's VENDORED list has \
                 {version}: update it with the vendored release's version and checksum"
            ));
        }
        out.push_str(locked);
        out.push('\n');
        if !lines.peek().is_some_and(|l| l.starts_with("source = ")) {
            out.push_str(&format!(
                "source = \"{CRATES_IO}\"\nchecksum = \"{checksum}\"\n"
            ));
        }
    }
    Ok(out)
}

pub fn run(workspace: &Path, args: &[String]) -> Result<(), String> {
    let usage = "usage: cargo xtask new-function <NAME> [--dir DIR]";
    let mut name = None;
    let mut dir = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dir" => dir = Some(PathBuf::from(it.next().ok_or(usage)?)),
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`\n{usage}")),
            s if name.is_none() => name = Some(s.to_string()),
            s => return Err(format!("unexpected argument `{s}`\n{usage}")),
        }
    }
    let name = name.ok_or(usage)?;
    check_name(&name)?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
    let created = create(workspace, &name, &dir)?;
    println!("created {} ({created} files)", dir.display());
    println!("build:  cd {} && cargo build --release", dir.display());
    println!(
        "output: {}/target/wasm32-wasip2/release/{}.wasm",
        dir.display(),
        name.replace('-', "_")
    );
    println!("deploy: see {}/README.md", dir.display());
    Ok(())
}

/// Writes the function `name` into `dir` (which must not exist or be empty); returns the number
/// of files written.
pub fn create(workspace: &Path, name: &str, dir: &Path) -> Result<usize, String> {
    let occupied = std::fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if occupied {
        return Err(format!(
            "{} exists and is not empty; choose another --dir",
            dir.display()
        ));
    }
    let render = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
    };
    let mut files: Vec<(PathBuf, String)> = vec![
        (dir.join("Cargo.toml"), render(CARGO_TOML)),
        (dir.join(".cargo/config.toml"), render(CONFIG_TOML)),
        (dir.join("src/lib.rs"), render(LIB_RS)),
        (dir.join("README.md"), render(README)),
        (dir.join(".gitignore"), render(GITIGNORE)),
    ];
    let wit = workspace.join("wit");
    for rel in ["pushdown.wit", "deps/wasi-nn/wasi-nn.wit"] {
        let text = std::fs::read_to_string(wit.join(rel))
            .map_err(|e| format!("reading {}: {e}", wit.join(rel).display()))?;
        files.push((dir.join("wit").join(rel), text));
    }
    // The dependency versions this repository builds and tests its own guests with.
    if let Ok(lock) = std::fs::read_to_string(workspace.join("guest-fns/Cargo.lock")) {
        files.push((dir.join("Cargo.lock"), lock_for_crates_io(&lock)?));
    }
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository, the run-time value first: clones sharing a build directory may share
    /// this binary.
    fn workspace() -> PathBuf {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("..")
    }

    #[test]
    fn the_vendored_list_matches_vendor_and_the_guests_lock() {
        let workspace = workspace();
        let lock = std::fs::read_to_string(workspace.join("guest-fns/Cargo.lock")).expect("lock");
        for (name, version, _) in VENDORED {
            let manifest = workspace.join("vendor").join(name).join("Cargo.toml");
            let manifest = std::fs::read_to_string(&manifest).expect("vendored Cargo.toml");
            assert!(
                manifest.contains(&format!("\nname = \"{name}\"\nversion = \"{version}\"\n")),
                "vendor/{name} is not {version}"
            );
            // Built from vendor/ (a path: no source line), not from crates.io.
            let entry = format!("name = \"{name}\"\nversion = \"{version}\"\n");
            let at = lock
                .find(&entry)
                .unwrap_or_else(|| panic!("{name} {version} not locked"));
            assert!(
                !lock[at + entry.len()..].starts_with("source"),
                "{name} not patched"
            );
        }
        // A lock whose version differs is refused, not rewritten.
        let stale = lock.replace(
            "name = \"png\"\nversion = \"0.18.1\"",
            "name = \"png\"\nversion = \"0.18.2\"",
        );
        let err = lock_for_crates_io(&stale).expect_err("stale");
        assert!(err.contains("png has `version = \"0.18.2\"`"), "{err}");
    }

    #[test]
    fn names_must_be_function_and_crate_names() {
        for ok in ["image-stats", "a", "f_2", &"x".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Image", "2fast", "a b", "../x", "a/b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_template_is_rendered_with_the_wit_beside_it_and_never_over_existing_files() {
        let tmp = std::env::temp_dir().join(format!("xtask-newfn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let workspace = workspace();
        let dir = tmp.join("my-fn");
        assert_eq!(create(&workspace, "my-fn", &dir), Ok(8));
        let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
        assert!(cargo.contains("name = \"my-fn\""), "{cargo}");
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).expect("lib.rs");
        assert!(!lib.contains("{{"), "unrendered placeholder left");
        assert!(dir.join("wit/deps/wasi-nn/wasi-nn.wit").exists());
        // The vendored crates come from crates.io in a function of its own.
        let lock = std::fs::read_to_string(dir.join("Cargo.lock")).expect("Cargo.lock");
        for (name, version, checksum) in VENDORED {
            let entry = format!(
                "name = \"{name}\"\nversion = \"{version}\"\nsource = \"{CRATES_IO}\"\n\
                 checksum = \"{checksum}\"\n"
            );
            assert!(
                lock.contains(&entry),
                "{name} {version} from crates.io:\n{lock}"
            );
        }
        let again = create(&workspace, "my-fn", &dir).expect_err("not over existing files");
        assert!(again.contains("not empty"), "{again}");
        std::fs::remove_dir_all(&tmp).expect("clean up");
    }
}
