//! Model packages for HAPI: a pre-trained network as a flat list of layers, each a TorchScript
//! file, so that layers [0, s) can run on the storage tier and [s, end) on the compute tier.
//!
//! Both tiers use this crate. Packages are made by `model/export/export_models.py`
//! (run by `cargo xtask setup`); see the manifest format in [`manifest`].

pub mod device;
mod error;
pub mod manifest;
mod package;
pub mod profile;
pub mod tensor;

pub use error::{ModelError, Result};
pub use manifest::{InputSpec, Layer, Manifest};
pub use package::{ModelPackage, list_packages};

use std::path::PathBuf;

/// The model packages directory: `$HAPI_MODELS`, else the one `cargo xtask setup` made for this
/// checkout (`.hapi/models`). The checkout is the one cargo runs from (`CARGO_MANIFEST_DIR` of
/// the running package, whose parent is the workspace), else the one this crate was built in:
/// clones that share a build directory share compiled crates, and the path compiled into one
/// may be another clone's.
pub fn models_dir() -> PathBuf {
    std::env::var_os("HAPI_MODELS").map_or_else(
        || {
            std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
                || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.hapi/models")),
                |dir| PathBuf::from(dir).join("../.hapi/models"),
            )
        },
        PathBuf::from,
    )
}
