//! wasi-nn for pushdown functions, on libtorch through the model crate.
//!
//! Graphs are only loaded by name, `<model>[a..b]` for layers [a, b) of a model package the
//! tenant may use. Loading graph bytes from a guest (`load`) is refused: a TorchScript file can
//! call arbitrary operators, including file I/O, so tenants never supply their own.
//!
//! Every tensor is checked (element type, rank, per-sample shape against the manifest, byte
//! length) before libtorch sees it, and the tensor bytes a guest holds in the host are capped
//! at its memory limit. Compute calls go through an [`Executor`], the seam where a batcher
//! pools work across tenants.

use crate::device::{DeviceError, Ran};
use crate::policy::Tenant;
use crate::runtime::State;
use crate::runtime::bindings::wasi::nn::errors::{self, ErrorCode};
use crate::runtime::bindings::wasi::nn::graph::{
    self, ExecutionTarget, GraphBuilder, GraphEncoding,
};
use crate::runtime::bindings::wasi::nn::inference::{self, NamedTensor};
use crate::runtime::bindings::wasi::nn::tensor::{self, TensorDimensions, TensorType};
use hapi_model::ModelPackage;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::Resource;

/// A loaded graph: a layer range of a model package.
#[derive(Debug)]
pub struct Graph {
    pub model: Arc<ModelPackage>,
    pub range: Range<usize>,
}

/// An execution context (one per `init-execution-context`).
#[derive(Debug)]
pub struct Context {
    graph: Arc<Graph>,
}

/// A tensor held by the host for a guest.
#[derive(Debug)]
pub struct Tensor {
    pub dimensions: Vec<u32>,
    pub ty: TensorType,
    pub data: Vec<u8>,
}

/// A wasi-nn error the guest sees: a code and a message saying what was wrong.
#[derive(Debug)]
pub struct NnError {
    pub code: ErrorCode,
    pub message: String,
}

/// Runs model segments for guests: on the calling thread ([`Direct`]) or on the shared device
/// with its memory budget, storage batch adaptation and pooling
/// ([`Device`](crate::device::Device)).
pub trait Executor: Send + Sync + std::fmt::Debug {
    fn run(
        &self,
        tenant: &Tenant,
        model: &Arc<ModelPackage>,
        range: Range<usize>,
        input: tch::Tensor,
    ) -> Result<Ran, DeviceError>;
}

/// Runs each compute call as it comes, on the caller's thread, with no budget.
#[derive(Debug, Default)]
pub struct Direct;

impl Executor for Direct {
    fn run(
        &self,
        _tenant: &Tenant,
        model: &Arc<ModelPackage>,
        range: Range<usize>,
        input: tch::Tensor,
    ) -> Result<Ran, DeviceError> {
        let started = Instant::now();
        let output = model
            .run(range, &input)
            .map_err(|e| DeviceError::Failed(e.to_string()))?;
        Ok(Ran {
            output,
            queued: std::time::Duration::ZERO,
            device: started.elapsed(),
            batches: 1,
        })
    }
}

/// Parses `<model>[a..b]`.
pub fn parse_graph_name(name: &str) -> Result<(&str, Range<usize>), String> {
    let bad = || format!("graph name `{name}` is not `<model>[a..b]`");
    let (model, rest) = name.split_once('[').ok_or_else(bad)?;
    let range = rest.strip_suffix(']').ok_or_else(bad)?;
    let (a, b) = range.split_once("..").ok_or_else(bad)?;
    let num = |s: &str| {
        if s.is_empty() || s.len() > 6 || !s.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            s.parse::<usize>().ok()
        }
    };
    let (a, b) = (num(a).ok_or_else(bad)?, num(b).ok_or_else(bad)?);
    if model.is_empty()
        || !model
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
    {
        return Err(bad());
    }
    if a >= b {
        return Err(format!("graph name `{name}`: empty layer range {a}..{b}"));
    }
    Ok((model, a..b))
}

fn element_size(ty: TensorType) -> usize {
    match ty {
        TensorType::Fp16 | TensorType::Bf16 => 2,
        TensorType::Fp32 | TensorType::I32 => 4,
        TensorType::Fp64 | TensorType::I64 => 8,
        TensorType::U8 => 1,
    }
}

impl State {
    fn nn_err<T>(
        &mut self,
        code: ErrorCode,
        message: String,
    ) -> wasmtime::Result<Result<T, Resource<NnError>>> {
        let r = self.table.push(NnError { code, message })?;
        Ok(Err(r))
    }

    /// Accounts `n` more tensor bytes held for the guest; traps past its memory limit.
    fn hold(&mut self, n: usize) -> wasmtime::Result<()> {
        let limit = self.tenant.limits.memory;
        let now = self.nn_bytes.saturating_add(n as u64);
        if now > limit {
            wasmtime::bail!(crate::runtime::Trap::TensorMemory { limit });
        }
        self.nn_bytes = now;
        Ok(())
    }

    fn release(&mut self, n: usize) {
        self.nn_bytes = self.nn_bytes.saturating_sub(n as u64);
    }

    fn check_input(&self, graph: &Graph, t: &Tensor) -> Result<(Vec<i64>, usize), String> {
        if t.ty != TensorType::Fp32 {
            return Err(format!(
                "input element type is {:?}; this backend takes FP32",
                t.ty
            ));
        }
        let expected = graph
            .model
            .shape_before(graph.range.start)
            .ok_or("layer range outside the model")?;
        let dims: Vec<i64> = t.dimensions.iter().map(|&d| i64::from(d)).collect();
        if dims.len() != expected.len() + 1 || dims[1..] != *expected || dims[0] < 1 {
            return Err(format!(
                "input dimensions {:?}; layer {} of `{}` takes (batch >= 1, {:?})",
                t.dimensions,
                graph.range.start,
                graph.model.name(),
                expected
            ));
        }
        let elements = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
        match elements.and_then(|e| e.checked_mul(element_size(t.ty))) {
            Some(n) if n == t.data.len() => Ok((dims, n)),
            Some(n) => Err(format!(
                "tensor data is {} bytes; dimensions {:?} of FP32 need {n}",
                t.data.len(),
                t.dimensions
            )),
            None => Err(format!("dimensions {:?} overflow", t.dimensions)),
        }
    }
}

impl graph::Host for State {
    fn load(
        &mut self,
        _builder: Vec<GraphBuilder>,
        _encoding: GraphEncoding,
        _target: ExecutionTarget,
    ) -> wasmtime::Result<Result<Resource<Graph>, Resource<NnError>>> {
        self.nn_err(
            ErrorCode::Security,
            "graphs are loaded by name (`<model>[a..b]`); this host does not run tenant-supplied graph bytes".into(),
        )
    }

    fn load_by_name(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<Resource<Graph>, Resource<NnError>>> {
        let (model, range) = match parse_graph_name(&name) {
            Ok(p) => p,
            Err(e) => return self.nn_err(ErrorCode::InvalidArgument, e),
        };
        if !self.tenant.models.contains(model) {
            return self.nn_err(
                ErrorCode::NotFound,
                format!(
                    "model `{model}` is not one tenant `{}` may use",
                    self.tenant.name
                ),
            );
        }
        let Some(manifest) = self.models.manifest(model) else {
            return self.nn_err(
                ErrorCode::NotFound,
                format!("no model `{model}` on this host"),
            );
        };
        let layers = manifest.layers.len();
        if range.end > layers {
            return self.nn_err(
                ErrorCode::InvalidArgument,
                format!("graph `{name}`: `{model}` has {layers} layers"),
            );
        }
        // Loading a package (on first use after start) is the host's time, not the tenant's.
        let started = Instant::now();
        let package = self.models.package(model);
        self.timings.queued += started.elapsed();
        match package {
            Ok(model) => Ok(Ok(self.table.push(Graph { model, range })?)),
            Err(e) => self.nn_err(ErrorCode::RuntimeError, e),
        }
    }
}

impl graph::HostGraph for State {
    fn init_execution_context(
        &mut self,
        graph: Resource<Graph>,
    ) -> wasmtime::Result<Result<Resource<Context>, Resource<NnError>>> {
        let g = self.table.get(&graph)?;
        let context = Context {
            graph: Arc::new(Graph {
                model: Arc::clone(&g.model),
                range: g.range.clone(),
            }),
        };
        Ok(Ok(self.table.push(context)?))
    }

    fn drop(&mut self, graph: Resource<Graph>) -> wasmtime::Result<()> {
        self.table.delete(graph)?;
        Ok(())
    }
}

impl tensor::Host for State {}

impl tensor::HostTensor for State {
    fn new(
        &mut self,
        dimensions: TensorDimensions,
        ty: TensorType,
        data: Vec<u8>,
    ) -> wasmtime::Result<Resource<Tensor>> {
        self.hold(data.len())?;
        Ok(self.table.push(Tensor {
            dimensions,
            ty,
            data,
        })?)
    }

    fn dimensions(&mut self, t: Resource<Tensor>) -> wasmtime::Result<TensorDimensions> {
        Ok(self.table.get(&t)?.dimensions.clone())
    }

    fn ty(&mut self, t: Resource<Tensor>) -> wasmtime::Result<TensorType> {
        Ok(self.table.get(&t)?.ty)
    }

    fn data(&mut self, t: Resource<Tensor>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get(&t)?.data.clone())
    }

    fn drop(&mut self, t: Resource<Tensor>) -> wasmtime::Result<()> {
        let t = self.table.delete(t)?;
        self.release(t.data.len());
        Ok(())
    }
}

impl inference::Host for State {}

impl inference::HostGraphExecutionContext for State {
    fn compute(
        &mut self,
        context: Resource<Context>,
        inputs: Vec<NamedTensor>,
    ) -> wasmtime::Result<Result<Vec<NamedTensor>, Resource<NnError>>> {
        let graph = Arc::clone(&self.table.get(&context)?.graph);
        if inputs.len() != 1 {
            return self.nn_err(
                ErrorCode::InvalidArgument,
                format!(
                    "compute takes exactly one input tensor, got {}",
                    inputs.len()
                ),
            );
        }
        let mut inputs = inputs;
        let (name, resource) = inputs.remove(0);
        let input = self.table.delete(resource)?;
        self.release(input.data.len());
        let (dims, _) = match self.check_input(&graph, &input) {
            Ok(v) => v,
            Err(e) => {
                return self.nn_err(ErrorCode::InvalidArgument, format!("input `{name}`: {e}"));
            }
        };
        let x = match hapi_model::tensor::f32_from_le_bytes(&dims, &input.data) {
            Ok(x) => x,
            Err(e) => {
                return self.nn_err(ErrorCode::InvalidArgument, format!("input `{name}`: {e}"));
            }
        };
        drop(input);
        let started = Instant::now();
        let ran = self
            .executor
            .run(&self.tenant, &graph.model, graph.range.clone(), x);
        let result = match ran {
            Ok(ran) => {
                self.timings.queued += ran.queued;
                self.timings.compute += started.elapsed().saturating_sub(ran.queued);
                let y = ran.output;
                y.size()
                    .iter()
                    .map(|&d| u32::try_from(d).map_err(|_| format!("output dimension {d}")))
                    .collect::<Result<Vec<u32>, String>>()
                    .and_then(|dims| Ok((dims, hapi_model::tensor::f32_to_le_bytes(&y)?)))
            }
            Err(e) => {
                let message = e.to_string();
                let code = match e {
                    DeviceError::TooLarge(_) => ErrorCode::TooLarge,
                    DeviceError::Busy { .. } | DeviceError::Failed(_) => ErrorCode::RuntimeError,
                };
                if !matches!(e, DeviceError::Failed(_)) {
                    // The host answers for the device, whatever the guest makes of it.
                    self.refused = Some(e);
                }
                self.timings.compute += started.elapsed();
                return self.nn_err(code, message);
            }
        };
        match result {
            Ok((dimensions, data)) => {
                self.hold(data.len())?;
                let out = self.table.push(Tensor {
                    dimensions,
                    ty: TensorType::Fp32,
                    data,
                })?;
                Ok(Ok(vec![("output".to_string(), out)]))
            }
            Err(e) => self.nn_err(ErrorCode::RuntimeError, e),
        }
    }

    fn drop(&mut self, context: Resource<Context>) -> wasmtime::Result<()> {
        self.table.delete(context)?;
        Ok(())
    }
}

impl errors::Host for State {}

impl errors::HostError for State {
    fn code(&mut self, e: Resource<NnError>) -> wasmtime::Result<ErrorCode> {
        Ok(self.table.get(&e)?.code)
    }

    fn data(&mut self, e: Resource<NnError>) -> wasmtime::Result<String> {
        Ok(self.table.get(&e)?.message.clone())
    }

    fn drop(&mut self, e: Resource<NnError>) -> wasmtime::Result<()> {
        self.table.delete(e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_graph_name;

    #[test]
    fn graph_names() {
        assert_eq!(parse_graph_name("resnet18[0..4]"), Ok(("resnet18", 0..4)));
        assert_eq!(
            parse_graph_name("efficientnet_lite0[3..25]"),
            Ok(("efficientnet_lite0", 3..25))
        );
        for bad in [
            "resnet18",
            "resnet18[0..4",
            "resnet18[a..4]",
            "[0..1]",
            "Res[0..1]",
            "r[-1..2]",
            "r[0..9999999]",
            "r[1 ..2]",
        ] {
            assert!(parse_graph_name(bad).is_err(), "{bad}");
        }
        assert!(
            parse_graph_name("r[3..3]")
                .expect_err("empty")
                .contains("empty layer range")
        );
    }
}
