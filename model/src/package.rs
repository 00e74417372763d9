//! A loaded model package: its manifest and one TorchScript module per layer.

use crate::manifest::Manifest;
use crate::{ModelError, Result};
use std::ops::Range;
use std::path::{Path, PathBuf};
use tch::{CModule, Device, Kind, Tensor};

/// A model split into layers, any contiguous range of which can run on its device.
///
/// Layers always run in eval mode without gradients: they are the frozen part of a transfer
/// learning job, so a sample's output never depends on its batch mates.
#[derive(Debug)]
pub struct ModelPackage {
    dir: PathBuf,
    manifest: Manifest,
    device: Device,
    segments: Vec<CModule>,
}

impl ModelPackage {
    /// Loads every segment of the package in `dir` onto `device`.
    pub fn load(dir: &Path, device: Device) -> Result<Self> {
        let manifest = Manifest::load(dir)?;
        let mut segments = Vec::with_capacity(manifest.layers.len());
        for (i, layer) in manifest.layers.iter().enumerate() {
            let path = dir.join(&layer.file);
            if !path.is_file() {
                return Err(ModelError::MissingSegment {
                    path,
                    layer: i,
                    name: layer.name.clone(),
                });
            }
            let mut module =
                CModule::load_on_device(&path, device).map_err(|e| ModelError::SegmentLoad {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            // The host charges a loaded model's memory by the manifest's parameter counts:
            // a layer that holds more than it declares is refused, not under-charged.
            let held: usize = module
                .named_parameters()
                .map_err(|e| ModelError::SegmentLoad {
                    path: path.clone(),
                    message: e.to_string(),
                })?
                .iter()
                .map(|(_, t)| t.numel())
                .sum();
            if held as u64 > layer.params {
                return Err(ModelError::UndeclaredParameters {
                    path,
                    layer: i,
                    name: layer.name.clone(),
                    declared: layer.params,
                    held: held as u64,
                });
            }
            module.set_eval();
            segments.push(module);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            device,
            segments,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn num_layers(&self) -> usize {
        self.segments.len()
    }

    /// Layers [0, freeze_index) are the frozen feature extractor.
    pub fn freeze_index(&self) -> usize {
        self.manifest.freeze_index
    }

    /// Per-sample shape that layer `index` takes (`index == num_layers()`: the model's output).
    pub fn shape_before(&self, index: usize) -> Option<&[i64]> {
        let layers = &self.manifest.layers;
        if index < layers.len() {
            Some(&layers[index].input_shape)
        } else {
            layers.last().map(|l| l.output_shape.as_slice())
        }
    }

    fn check_range(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.num_layers() {
            return Err(ModelError::LayerRange {
                model: self.manifest.name.clone(),
                start: range.start,
                end: range.end,
                layers: self.num_layers(),
            });
        }
        Ok(())
    }

    /// Checks that `input` is what layer `layer` takes: fp32, rank and per-sample shape from
    /// the manifest, at least one sample. Runs before libtorch sees the tensor.
    pub fn check_input(&self, layer: usize, input: &Tensor) -> Result<()> {
        let expected = self.shape_before(layer).ok_or(ModelError::LayerRange {
            model: self.manifest.name.clone(),
            start: layer,
            end: layer,
            layers: self.num_layers(),
        })?;
        let name = self
            .manifest
            .layers
            .get(layer)
            .map_or("(output)", |l| l.name.as_str());
        let bad = |reason: String| ModelError::BadInput {
            model: self.manifest.name.clone(),
            layer,
            name: name.to_string(),
            reason,
        };
        let kind = input.kind();
        if kind != Kind::Float {
            return Err(bad(format!("element type is {kind:?}, expected f32")));
        }
        let size = input.size();
        if size.len() != expected.len() + 1 {
            return Err(bad(format!(
                "rank {} (shape {size:?}), expected {} (batch, {expected:?})",
                size.len(),
                expected.len() + 1
            )));
        }
        if size[0] < 1 {
            return Err(bad("empty batch".into()));
        }
        if size[1..] != *expected {
            return Err(bad(format!(
                "per-sample shape {:?}, expected {expected:?}",
                &size[1..]
            )));
        }
        Ok(())
    }

    /// Runs layers `range` on `input` (batch first) and returns the output on this package's
    /// device. An empty range returns the input unchanged.
    pub fn run(&self, range: Range<usize>, input: &Tensor) -> Result<Tensor> {
        self.check_range(&range)?;
        self.check_input(range.start, input)?;
        let model = &self.manifest.name;
        tch::no_grad(|| {
            let mut x = input.to_device(self.device);
            for i in range {
                let layer = &self.manifest.layers[i];
                x = self.segments[i]
                    .forward_ts(&[&x])
                    .map_err(|e| ModelError::Forward {
                        model: model.clone(),
                        layer: i,
                        name: layer.name.clone(),
                        message: e.to_string(),
                    })?;
                let got = x.size();
                if got.len() != layer.output_shape.len() + 1 || got[1..] != layer.output_shape {
                    return Err(ModelError::OutputShape {
                        model: model.clone(),
                        layer: i,
                        name: layer.name.clone(),
                        expected: layer.output_shape.clone(),
                        got: got.get(1..).unwrap_or_default().to_vec(),
                    });
                }
            }
            Ok(x)
        })
    }

    /// Class labels, one per output index, for packages that ship them.
    pub fn labels(&self) -> Result<Option<Vec<String>>> {
        let Some(file) = &self.manifest.labels else {
            return Ok(None);
        };
        let path = self.dir.join(file);
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Some(text.lines().map(str::to_string).collect()))
    }

    /// The exporter's reference pair: a fixed input and the whole PyTorch model's output.
    pub fn reference(&self) -> Result<(Tensor, Tensor)> {
        let path = self.dir.join("reference.safetensors");
        let tensors = Tensor::read_safetensors(&path).map_err(|e| ModelError::SegmentLoad {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let find = |name: &str| {
            tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.shallow_clone())
                .ok_or_else(|| ModelError::InvalidManifest {
                    path: path.clone(),
                    reason: format!("no tensor named `{name}`"),
                })
        };
        Ok((find("input")?, find("output")?))
    }
}

/// The package directories (those holding a `manifest.json`) under `root`, sorted by name.
pub fn list_packages(root: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| ModelError::Io {
        path: root.to_path_buf(),
        source,
    };
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.join("manifest.json").is_file() {
            dirs.push(path);
        }
    }
    dirs.sort();
    Ok(dirs)
}
