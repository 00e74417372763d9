//! Errors of the model crate. Every variant names the file, layer or tensor at fault, because
//! packages are built elsewhere and tensors come from tenants: "shape mismatch" alone helps no one.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: manifest does not parse: {source}")]
    ManifestParse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: invalid manifest: {reason}")]
    InvalidManifest { path: PathBuf, reason: String },
    #[error("{path}: segment file is missing (layer {layer} `{name}`)")]
    MissingSegment {
        path: PathBuf,
        layer: usize,
        name: String,
    },
    #[error("{path}: libtorch cannot load the segment: {message}")]
    SegmentLoad { path: PathBuf, message: String },
    #[error(
        "{path}: layer {layer} `{name}` holds {held} parameters; its manifest declares {declared}"
    )]
    UndeclaredParameters {
        path: PathBuf,
        layer: usize,
        name: String,
        declared: u64,
        held: u64,
    },
    #[error("model `{model}`: layer range {start}..{end} is outside 0..={layers}")]
    LayerRange {
        model: String,
        start: usize,
        end: usize,
        layers: usize,
    },
    #[error("model `{model}`: bad input for layer {layer} `{name}`: {reason}")]
    BadInput {
        model: String,
        layer: usize,
        name: String,
        reason: String,
    },
    #[error("model `{model}`: layer {layer} `{name}` failed in libtorch: {message}")]
    Forward {
        model: String,
        layer: usize,
        name: String,
        message: String,
    },
    #[error(
        "model `{model}`: layer {layer} `{name}` returned shape {got:?}, the manifest says {expected:?}"
    )]
    OutputShape {
        model: String,
        layer: usize,
        name: String,
        expected: Vec<i64>,
        got: Vec<i64>,
    },
    #[error("device `{spec}`: {reason}")]
    Device { spec: String, reason: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
