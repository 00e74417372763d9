//! The model package manifest (`manifest.json`), as the exporter writes it.

use crate::{ModelError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The manifest format this crate reads.
pub const FORMAT: u32 = 1;

/// What a model package is: its origin, its input, and its flat list of layers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// Short name used in graph names (`resnet18[0..4]`): lowercase, digits, `_`.
    pub name: String,
    pub display_name: String,
    /// Where the model code and weights come from.
    pub source: String,
    pub license: String,
    /// Origin of the weights, or text starting with `random-init` for untrained ones.
    pub weights: String,
    pub torch_version: String,
    pub input: InputSpec,
    /// File with one class label per line, for models with a classifier.
    pub labels: Option<String>,
    /// Layers [0, freeze_index) are frozen in transfer learning (the paper's index).
    pub freeze_index: usize,
    pub layers: Vec<Layer>,
}

/// The model's input: per-sample shape ((C, H, W), or (H, W, C) with layout `nhwc`) and its
/// preprocessing. The fields after `std` may be left out; their defaults are torchvision's
/// ImageNet recipe (docs/model-package.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    pub shape: Vec<i64>,
    /// The shorter side is resized to this many pixels (both sides with `resize_mode`
    /// `squash`)...
    pub resize: u32,
    /// ...then the centre `crop` x `crop` square is taken.
    pub crop: u32,
    /// Per model input channel (in `channel_order`): (x - mean) / std, x in `scale` units.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// `shorter` (keep the aspect ratio) or `squash`.
    #[serde(default = "shorter")]
    pub resize_mode: String,
    /// `bilinear` or `bicubic`, as Pillow and torchvision compute them (antialiased).
    #[serde(default = "bilinear")]
    pub interpolation: String,
    /// `rgb` or `bgr`.
    #[serde(default = "rgb")]
    pub channel_order: String,
    /// `nchw` or `nhwc`.
    #[serde(default = "nchw")]
    pub layout: String,
    /// Pixel unit before normalisation: 1 ([0, 1]) or 255 ([0, 255]).
    #[serde(default = "unit")]
    pub scale: f32,
}

fn shorter() -> String {
    "shorter".into()
}
fn bilinear() -> String {
    "bilinear".into()
}
fn rgb() -> String {
    "rgb".into()
}
fn nchw() -> String {
    "nchw".into()
}
fn unit() -> f32 {
    1.0
}

impl InputSpec {
    /// The preprocessing this model expects, as both tiers run it; an error names the field
    /// that is not one of its values.
    pub fn try_transform(&self) -> Result<hapi_preprocess::Transform, String> {
        use hapi_preprocess::{ChannelOrder, Filter, Layout, ResizeMode, Scale, Transform};
        let field = |name: &str, e: String| format!("input.{name}: {e}");
        Ok(Transform {
            resize_mode: self
                .resize_mode
                .parse::<ResizeMode>()
                .map_err(|e| field("resize_mode", e))?,
            filter: self
                .interpolation
                .parse::<Filter>()
                .map_err(|e| field("interpolation", e))?,
            channel_order: self
                .channel_order
                .parse::<ChannelOrder>()
                .map_err(|e| field("channel_order", e))?,
            layout: self
                .layout
                .parse::<Layout>()
                .map_err(|e| field("layout", e))?,
            scale: Scale::from_max(self.scale).map_err(|e| field("scale", e))?,
            ..Transform::new(self.resize, self.crop, self.mean, self.std)
        })
    }

    /// The preprocessing of a validated manifest (every loaded package's is).
    pub fn transform(&self) -> hapi_preprocess::Transform {
        self.try_transform().unwrap_or_else(|_| {
            hapi_preprocess::Transform::new(self.resize, self.crop, self.mean, self.std)
        })
    }
}

/// Most layers a package may have: far past any split granularity, and small enough that
/// sums over them cannot overflow.
pub const MAX_LAYERS: usize = 4096;
/// Most parameters a layer may declare (about a trillion): the host charges 4 bytes for each,
/// summed over at most [`MAX_LAYERS`] layers, so these counts cannot wrap a u64.
pub const MAX_LAYER_PARAMS: u64 = 1 << 40;
/// Most elements a declared shape may have (per sample; 1 GiB of f32), and most dimensions.
pub const MAX_SAMPLE_ELEMENTS: i64 = 1 << 28;
pub const MAX_RANK: usize = 8;
/// Largest `manifest.json` read.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// One segment: a TorchScript file and the per-sample shapes it maps between.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub name: String,
    pub file: String,
    pub input_shape: Vec<i64>,
    pub output_shape: Vec<i64>,
    pub params: u64,
}

impl Layer {
    /// fp32 bytes of one sample's output: what crossing the network after this layer costs.
    pub fn output_bytes_per_sample(&self) -> u64 {
        4 * self
            .output_shape
            .iter()
            .map(|&d| u64::try_from(d).unwrap_or(0))
            .product::<u64>()
    }
}

impl Manifest {
    /// Reads and validates `<dir>/manifest.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with_bytes(dir).map(|(m, _)| m)
    }

    /// [`Manifest::load`], with the bytes it read (at most [`MAX_MANIFEST_BYTES`], one read of
    /// a regular file: what is digested is what was parsed).
    pub fn load_with_bytes(dir: &Path) -> Result<(Self, Vec<u8>)> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("manifest.json");
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        let invalid = |reason: String| ModelError::InvalidManifest {
            path: path.clone(),
            reason,
        };
        // Not blocking: a FIFO is refused, not waited on.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(invalid("not a regular file".into()));
        }
        let mut bytes = Vec::new();
        file.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(invalid(format!("more than {MAX_MANIFEST_BYTES} bytes")));
        }
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|source| ModelError::ManifestParse {
                path: path.clone(),
                source,
            })?;
        manifest.validate().map_err(invalid)?;
        Ok((manifest, bytes))
    }

    /// Checks everything that can be checked without libtorch: format, names, freeze index,
    /// and that each layer's input shape is the previous layer's output shape.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != FORMAT {
            return Err(format!(
                "format {} is not supported (expected {FORMAT})",
                self.format
            ));
        }
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !name_ok {
            return Err(format!(
                "name `{}` must be non-empty lowercase ASCII letters, digits and `_`",
                self.name
            ));
        }
        if self.layers.is_empty() {
            return Err("no layers".into());
        }
        if self.layers.len() > MAX_LAYERS {
            return Err(format!(
                "{} layers; at most {MAX_LAYERS}",
                self.layers.len()
            ));
        }
        if self.freeze_index > self.layers.len() {
            return Err(format!(
                "freeze_index {} is past the last layer ({} layers)",
                self.freeze_index,
                self.layers.len()
            ));
        }
        check_shape("input.shape", &self.input.shape)?;
        if self.input.shape.len() != 3 {
            return Err(format!(
                "input.shape {:?} must be (channels, height, width)",
                self.input.shape
            ));
        }
        if self.input.std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
            return Err(format!("input.std {:?} must be positive", self.input.std));
        }
        if self.input.crop == 0 || self.input.resize < self.input.crop {
            return Err(format!(
                "input.resize {} must be at least input.crop {} (> 0)",
                self.input.resize, self.input.crop
            ));
        }
        if self.input.resize > hapi_preprocess::MAX_IMAGE_SIDE {
            return Err(format!(
                "input.resize {} is past {} pixels, the largest image side decoded",
                self.input.resize,
                hapi_preprocess::MAX_IMAGE_SIDE
            ));
        }
        let t = self.input.try_transform()?;
        let want: Vec<i64> = t.sample_shape().iter().map(|&d| i64::from(d)).collect();
        if self.input.shape != want {
            return Err(format!(
                "input.shape {:?} is not what the preprocessing makes ({want:?}: {} layout, crop {})",
                self.input.shape, self.input.layout, self.input.crop
            ));
        }
        let mut previous = ("input.shape".to_string(), &self.input.shape);
        for (i, layer) in self.layers.iter().enumerate() {
            if !is_plain_file_name(&layer.file) {
                return Err(format!(
                    "layer {i} `{}`: file `{}` must be a plain file name",
                    layer.name, layer.file
                ));
            }
            if layer.params > MAX_LAYER_PARAMS {
                return Err(format!(
                    "layer {i} `{}`: params {} is past {MAX_LAYER_PARAMS}",
                    layer.name, layer.params
                ));
            }
            check_shape(&format!("layer {i} input_shape"), &layer.input_shape)?;
            check_shape(&format!("layer {i} output_shape"), &layer.output_shape)?;
            if &layer.input_shape != previous.1 {
                return Err(format!(
                    "shapes do not chain: layer {i} `{}` takes {:?} but {} is {:?}",
                    layer.name, layer.input_shape, previous.0, previous.1
                ));
            }
            previous = (
                format!("layer {} `{}` output", i, layer.name),
                &layer.output_shape,
            );
        }
        if let Some(labels) = &self.labels
            && !is_plain_file_name(labels)
        {
            return Err(format!("labels `{labels}` must be a plain file name"));
        }
        Ok(())
    }

    pub fn is_random_init(&self) -> bool {
        self.weights.starts_with("random-init")
    }
}

fn check_shape(what: &str, shape: &[i64]) -> Result<(), String> {
    if shape.is_empty() || shape.iter().any(|&d| d <= 0) {
        return Err(format!("{what} {shape:?} must have positive dimensions"));
    }
    if shape.len() > MAX_RANK {
        return Err(format!("{what} {shape:?}: at most {MAX_RANK} dimensions"));
    }
    let elements = shape.iter().try_fold(1i64, |n, &d| {
        n.checked_mul(d).filter(|&n| n <= MAX_SAMPLE_ELEMENTS)
    });
    if elements.is_none() {
        return Err(format!(
            "{what} {shape:?}: more than {MAX_SAMPLE_ELEMENTS} elements per sample"
        ));
    }
    Ok(())
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\\')
        && !name.contains('\0')
}
