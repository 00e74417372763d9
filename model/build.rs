//! Nothing to build. This script exists so that the `[build-dependencies]` in Cargo.toml take
//! part in feature resolution: without a build script cargo resolves them for `cargo tree` but
//! leaves them out of real builds, and torch-sys's build dependencies (sha2, zip) would get other
//! features under `cargo build -p hapi-model` than under `cargo build --workspace`. See
//! `cargo xtask features`.
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
}
