//! `feature-extract`: the pushdown function of HAPI (Petrescu et al., SoCC 2024).
//!
//! Reads the invocation's objects from the tenant's granted bucket, decodes them (JPEG, PNG;
//! grayscale becomes RGB), preprocesses them as the model's package says (resize, centre crop,
//! normalise), batches them into an NCHW f32 tensor and runs layers [0, split) of the model
//! through wasi-nn, by loading the graph named `<model>[0..split]`, and returns the output
//! tensor's handle: its bytes go from the host's device to the response without a copy through
//! this function's memory. The output tensor's first dimension follows the order of the
//! invocation's keys. `model` is required; without `split`
//! it runs up to the model's freeze index (all its frozen layers).
//!
//! Options: `dtype` = `f32` (the default), `f16` or `bf16`: the element type of the output. The
//! layers run in FP32 either way; the host's device narrows their output (the graph is loaded
//! as `<model>[0..split]@f16`), which halves what the response carries. Split 0 (the
//! preprocessed input itself) is f32 only. Any other option is rejected, so a typo does not go
//! unnoticed.
//!
//! Build: `cargo component build --release --target wasm32-wasip2`, or plain
//! `cargo build --release` in `guest-fns/` (its `.cargo/config.toml` selects wasm32-wasip2).

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

use bindings::hapi::pushdown::models::{self, ModelInfo};
use bindings::hapi::pushdown::objects;
use bindings::hapi::pushdown::types::{ElementType, ObjectFailure, Output, TensorOut};
use bindings::wasi::nn::{self, graph, tensor};
use bindings::{Error, Guest, Invocation};
use hapi_preprocess::{Transform, decode, transform_into_le_bytes};

/// Most objects in one invocation. The host caps bytes read and output size as well; this
/// bounds the preprocessed batch (150,528 f32 per 224x224 sample, about 600 KB).
pub const MAX_KEYS: usize = 1024;

struct FeatureExtract;

impl Guest for FeatureExtract {
    fn run(invocation: Invocation) -> Result<Output, Error> {
        let mut dtype = Dtype::F32;
        for (key, value) in &invocation.options {
            match key.as_str() {
                "dtype" => dtype = Dtype::parse(value)?,
                _ => {
                    return Err(Error::BadRequest(format!(
                        "feature-extract takes one option, `dtype` (got `{key}`)"
                    )));
                }
            }
        }
        if invocation.keys.is_empty() || invocation.keys.len() > MAX_KEYS {
            return Err(Error::BadRequest(format!(
                "{} keys; an invocation takes 1..={MAX_KEYS}",
                invocation.keys.len()
            )));
        }
        let model = invocation.model.as_deref().ok_or_else(|| {
            Error::BadRequest("feature-extract needs `model` (see GET /v1/models)".into())
        })?;
        let info = models::describe(model).map_err(Error::BadRequest)?;
        let split = invocation.split.unwrap_or(info.freeze_index);
        if split > info.layers {
            return Err(Error::BadRequest(format!(
                "split {split} is past the last layer of `{}` ({} layers)",
                info.name, info.layers
            )));
        }
        let transform = transform_of(&info)?;
        // The batch is built as the tensor's little-endian bytes directly: no f32 copy.
        let mut data = Vec::with_capacity(invocation.keys.len() * 4 * transform.sample_len());
        for key in &invocation.keys {
            let bytes = objects::get(&invocation.bucket, key).map_err(Error::Object)?;
            let bad = |reason: String| {
                Error::BadObject(ObjectFailure {
                    key: key.clone(),
                    reason,
                })
            };
            let image = decode(&bytes).map_err(|e| bad(e.to_string()))?;
            transform_into_le_bytes(&image, &transform, &mut data)
                .map_err(|e| bad(e.to_string()))?;
        }
        let mut dims = vec![invocation.keys.len() as u32];
        dims.extend(transform.sample_shape());
        if split == 0 {
            if dtype != Dtype::F32 {
                return Err(Error::BadRequest(format!(
                    "dtype `{}` needs split >= 1: split 0 returns the preprocessed input, in f32",
                    dtype.name()
                )));
            }
            return Ok(Output::Bytes(TensorOut {
                dimensions: dims,
                ty: ElementType::F32,
                data,
            }));
        }
        infer(&info.name, split, dtype, dims, data)
    }
}

/// The `dtype` option.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::Bf16),
            other => Err(Error::BadRequest(format!(
                "dtype `{other}`: expected f32, f16 or bf16"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// What wasi-nn returns.
    fn types(self) -> tensor::TensorType {
        match self {
            Self::F32 => tensor::TensorType::Fp32,
            Self::F16 => tensor::TensorType::Fp16,
            Self::Bf16 => tensor::TensorType::Bf16,
        }
    }
}

/// The model's preprocessing, as its package describes it (resize mode, resampling, channel
/// order, layout and pixel scale included).
fn transform_of(info: &ModelInfo) -> Result<Transform, Error> {
    use hapi_preprocess::{ChannelOrder, Filter, Layout, ResizeMode, Scale};
    let spec = &info.input;
    if spec.channels != 3 || spec.height != spec.crop || spec.width != spec.crop {
        return Err(Error::Inference(format!(
            "model `{}` takes {}x{}x{} input, which this function does not produce",
            info.name, spec.channels, spec.height, spec.width
        )));
    }
    let bad = |e: String| Error::Inference(format!("model `{}`: {e}", info.name));
    Ok(Transform {
        resize_mode: match spec.resize_mode {
            models::ResizeMode::Shorter => ResizeMode::Shorter,
            models::ResizeMode::Squash => ResizeMode::Squash,
        },
        filter: match spec.interpolation {
            models::Interpolation::Bilinear => Filter::Bilinear,
            models::Interpolation::Bicubic => Filter::Bicubic,
        },
        channel_order: match spec.channel_order {
            models::ChannelOrder::Rgb => ChannelOrder::Rgb,
            models::ChannelOrder::Bgr => ChannelOrder::Bgr,
        },
        layout: match spec.layout {
            models::Layout::Nchw => Layout::Nchw,
            models::Layout::Nhwc => Layout::Nhwc,
        },
        scale: Scale::from_max(spec.scale).map_err(bad)?,
        ..Transform::from_lists(spec.resize, spec.crop, &spec.mean, &spec.std)
            .map_err(|e| bad(e.to_string()))?
    })
}

fn nn_error(what: &str, e: nn::errors::Error) -> Error {
    Error::Inference(format!("{what}: {:?}: {}", e.code(), e.data()))
}

fn infer(
    model: &str,
    split: u32,
    dtype: Dtype,
    dims: Vec<u32>,
    data: Vec<u8>,
) -> Result<Output, Error> {
    let name = match dtype {
        Dtype::F32 => format!("{model}[0..{split}]"),
        other => format!("{model}[0..{split}]@{}", other.name()),
    };
    let nn_type = dtype.types();
    let graph =
        graph::load_by_name(&name).map_err(|e| nn_error(&format!("loading graph `{name}`"), e))?;
    let context = graph
        .init_execution_context()
        .map_err(|e| nn_error("creating an execution context", e))?;
    let input = tensor::Tensor::new(&dims, tensor::TensorType::Fp32, &data);
    let mut outputs = context
        .compute(vec![("input".to_string(), input)])
        .map_err(|e| nn_error(&format!("running `{name}`"), e))?;
    if outputs.len() != 1 {
        return Err(Error::Inference(format!(
            "`{name}` returned {} tensors, expected 1",
            outputs.len()
        )));
    }
    let (_, output) = outputs.remove(0);
    if output.ty() != nn_type {
        return Err(Error::Inference(format!(
            "`{name}` returned {:?}, expected {nn_type:?}",
            output.ty()
        )));
    }
    // Handed to the host as it is: its bytes never enter this function's memory.
    Ok(Output::Nn(output))
}

bindings::export!(FeatureExtract with_types_in bindings);
