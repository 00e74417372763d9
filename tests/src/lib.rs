//! Support shared by the integration tests of several crates: the guests built from source and
//! the `hapi-host` binary as a child process. The end-to-end tests themselves live in tests/.

pub mod alloc;
pub mod cluster;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The workspace root: the parent of the running test's package (cargo sets
/// `CARGO_MANIFEST_DIR` when it runs a test), else of this crate as built. The run-time value
/// comes first because clones sharing a build directory share this compiled crate, and the path
/// compiled into it may be another clone's.
pub fn workspace() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

/// The venv's Python (with PyTorch, torchvision and Pillow), which `cargo xtask env` exports
/// as `HAPI_PYTHON`.
pub fn python() -> std::ffi::OsString {
    std::env::var_os("HAPI_PYTHON").expect(
        "HAPI_PYTHON is not set: run the tests through `cargo xtask test`, or `source <(cargo xtask env)` first",
    )
}

/// The binary `name` of the package under test, beside the running test binary
/// (`<target>/debug/deps/<test>-<hash>` -> `<target>/debug/<name>`), else `compiled`, the
/// `CARGO_BIN_EXE_<name>` cargo compiled into the test: clones sharing a build directory share
/// test binaries that are up to date for both, and the path compiled in may be another clone's
/// (which may be gone).
pub fn package_binary(name: &str, compiled: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join(name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(compiled))
}

/// scikit-image's sample photos, as `cargo xtask setup` installs them: `$HAPI_PHOTOS`, else
/// the workspace's `.hapi/photos` link.
pub fn photos_dir() -> PathBuf {
    std::env::var_os("HAPI_PHOTOS").map_or_else(|| workspace().join(".hapi/photos"), PathBuf::from)
}

/// Builds the guests (`guest-fns/`) from source once per test binary; returns the directory
/// holding `<name>.wasm`.
pub fn guests() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = workspace().join("guest-fns");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--release", "--quiet"])
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .output()
            .expect("running cargo for the guests");
        assert!(
            out.status.success(),
            "building guests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        workspace().join(".hapi/target-guests/wasm32-wasip2/release")
    })
}

/// The built guest `name` (e.g. `feature-extract`).
pub fn guest(name: &str) -> PathBuf {
    let p = guests().join(format!("{}.wasm", name.replace('-', "_")));
    assert!(p.exists(), "{} was not built", p.display());
    p
}

/// A running `hapi-host serve`, killed on drop.
#[derive(Debug)]
pub struct HostProcess {
    pub child: Child,
    /// `http://addr:port`, as the host printed it.
    pub url: String,
}

impl HostProcess {
    /// Runs `binary serve --policy <policy> --listen <listen>` and waits for its
    /// `listening on <url>` line.
    pub fn serve(binary: &Path, policy: &Path, listen: &str) -> Self {
        Self::serve_with(binary, policy, listen, |_| {})
    }

    /// [`HostProcess::serve`], with `configure` applied to the command before it is spawned
    /// (to set resource limits, for example).
    pub fn serve_with(
        binary: &Path,
        policy: &Path,
        listen: &str,
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let mut command = Command::new(binary);
        command
            .args(["serve", "--policy"])
            .arg(policy)
            .args(["--listen", listen]);
        configure(&mut command);
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("hapi-host starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("first line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Self { child, url }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
