//! The wasi-nn interfaces (graph, tensor, inference, errors) over the host's device.

use crate::account::memory::HANDLE_BYTES;
use crate::account::text::{bounded, quote};
use crate::bindings::wasi::nn::errors::{self, ErrorCode};
use crate::bindings::wasi::nn::graph::{self, ExecutionTarget, GraphBuilder, GraphEncoding};
use crate::bindings::wasi::nn::inference::{self, NamedTensor};
use crate::bindings::wasi::nn::tensor::{self, TensorDimensions, TensorType};
use crate::caps::caller::{Caller, Stop};
use crate::caps::nn::resources::{
    Code, Context, ElemType, Graph, GraphInfo, NnError, Tensor, check_input, parse_graph_name,
    split_out_kind,
};
use crate::device::{Device, DeviceError, Input, Job, WireDtype};
use crate::models::Models;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable, WasmList};

/// The capability's state in one invocation's store.
#[derive(Debug)]
pub struct NnCtx {
    caller: Caller,
    device: Arc<Device>,
    models: Arc<Models>,
    /// Time waiting for the device (memory, batch mates, other tenants' turns, a model's
    /// first load).
    pub queue_time: Duration,
}

impl NnCtx {
    pub fn new(caller: Caller, device: Arc<Device>, models: Arc<Models>) -> Self {
        Self {
            caller,
            device,
            models,
            queue_time: Duration::ZERO,
        }
    }
}

/// What wasi-nn's host functions borrow from the store: the context and the handle table.
#[derive(Debug)]
pub struct NnView<'a> {
    pub ctx: &'a mut NnCtx,
    pub table: &'a mut ResourceTable,
}

#[derive(Debug)]
pub struct Nn;

impl HasData for Nn {
    type Data<'a> = NnView<'a>;
}

/// Adds the wasi-nn interfaces to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> NnView<'_>,
) -> wasmtime::Result<()> {
    graph::add_to_linker::<T, Nn>(linker, get)?;
    // `load` refuses graph bytes whatever they are, but bindgen's `list<list<u8>>` copied
    // them first: a list of one-byte lists all pointing at one byte made the host allocate 56
    // bytes (the outer element and a 32-byte allocation) for every 25 of the call's hostcall
    // fuel (the tenant's memory limit), tens of millions of allocations in one poll that no
    // tick stops. Shadowed by the same function taking its lists as views of the guest's
    // memory (`WasmList`: bounds checked, nothing copied).
    linker.allow_shadowing(true);
    let shadowed = linker.instance(GRAPH_INTERFACE)?.func_wrap_async(
        "load",
        move |mut store, _: GraphBytes| {
            Box::new(async move { Ok((get(store.data_mut()).refuse_graph_bytes()?,)) })
        },
    );
    linker.allow_shadowing(false);
    shadowed?;
    tensor::add_to_linker::<T, Nn>(linker, get)?;
    inference::add_to_linker::<T, Nn>(linker, get)?;
    errors::add_to_linker::<T, Nn>(linker, get)?;
    Ok(())
}

/// The instance `graph` is imported as.
const GRAPH_INTERFACE: &str = "wasi:nn/graph@0.2.0-rc-2024-10-28";

/// `graph.load`'s arguments, left in the guest's memory.
type GraphBytes = (WasmList<WasmList<u8>>, GraphEncoding, ExecutionTarget);

fn elem(t: TensorType) -> ElemType {
    match t {
        TensorType::Fp16 => ElemType::Fp16,
        TensorType::Fp32 => ElemType::Fp32,
        TensorType::Fp64 => ElemType::Fp64,
        TensorType::Bf16 => ElemType::Bf16,
        TensorType::U8 => ElemType::U8,
        TensorType::I32 => ElemType::I32,
        TensorType::I64 => ElemType::I64,
    }
}

fn wit_type(t: ElemType) -> TensorType {
    match t {
        ElemType::Fp16 => TensorType::Fp16,
        ElemType::Fp32 => TensorType::Fp32,
        ElemType::Fp64 => TensorType::Fp64,
        ElemType::Bf16 => TensorType::Bf16,
        ElemType::U8 => TensorType::U8,
        ElemType::I32 => TensorType::I32,
        ElemType::I64 => TensorType::I64,
    }
}

fn wit_code(c: Code) -> ErrorCode {
    match c {
        Code::InvalidArgument => ErrorCode::InvalidArgument,
        Code::RuntimeError => ErrorCode::RuntimeError,
        Code::TooLarge => ErrorCode::TooLarge,
        Code::NotFound => ErrorCode::NotFound,
        Code::Security => ErrorCode::Security,
    }
}

type Answer<T> = wasmtime::Result<Result<T, Resource<NnError>>>;

fn trap(e: impl Into<Stop>) -> wasmtime::Error {
    e.into().trap()
}

impl NnView<'_> {
    /// A wasi-nn error for the guest, its message bounded and charged.
    fn error<T>(&mut self, code: Code, message: String) -> Answer<T> {
        let message = bounded(message);
        let charge = self
            .ctx
            .caller
            .account
            .charge(HANDLE_BYTES + message.len() as u64, "wasi-nn error")
            .map_err(trap)?;
        let r = self.table.push(NnError {
            code,
            message,
            charge,
        })?;
        Ok(Err(r))
    }

    /// `graph.load`'s answer, whatever its bytes.
    fn refuse_graph_bytes(&mut self) -> Answer<Resource<Graph>> {
        self.error(
            Code::Security,
            "graphs are loaded by name (`<model>[a..b]`); this host does not run tenant-supplied graph bytes".into(),
        )
    }

    /// Inputs of a `compute` refused before it ran: they were the guest's to give (owned
    /// handles), so they go now with their memory, not when the invocation ends.
    fn drop_inputs(&mut self, inputs: Vec<NamedTensor>) {
        for (_, tensor) in inputs {
            // A handle that is not a tensor of this table was refused when the call was lifted.
            let _ = self.table.delete(tensor);
        }
    }

    /// The device did not run a call: the guest stops there. Its deadline or memory limit is
    /// the tenant's; a refusal or a fault is the host's answer to the request.
    fn device_error<T>(&mut self, e: DeviceError) -> Answer<T> {
        Err(match e {
            DeviceError::Expired(limit) => trap(Stop::Time {
                limit,
                during: "while waiting for or running on the device",
            }),
            DeviceError::Memory(over) => trap(over),
            other => trap(Stop::Device(other)),
        })
    }
}

impl graph::Host for NnView<'_> {
    /// Never called: shadowed in [`add_to_linker`].
    async fn load(
        &mut self,
        _builder: Vec<GraphBuilder>,
        _encoding: GraphEncoding,
        _target: ExecutionTarget,
    ) -> Answer<Resource<Graph>> {
        self.refuse_graph_bytes()
    }

    async fn load_by_name(&mut self, name: String) -> Answer<Resource<Graph>> {
        let parsed = split_out_kind(&name).and_then(|(graph, out)| {
            parse_graph_name(graph).map(|(model, range)| (model, range, out))
        });
        let (model, range, out) = match parsed {
            Ok(p) => p,
            Err(e) => return self.error(Code::InvalidArgument, e),
        };
        let tenant = self.ctx.caller.tenant_now().map_err(trap)?;
        let Some(resolved) = self.ctx.models.resolve(&tenant, model) else {
            return self.error(
                Code::NotFound,
                format!(
                    "model `{model}` is not one tenant `{}` may use",
                    tenant.name
                ),
            );
        };
        let manifest = resolved.manifest;
        let layers = manifest.layers.len();
        if range.end > layers {
            return self.error(
                Code::InvalidArgument,
                format!("graph `{}`: `{model}` has {layers} layers", quote(&name)),
            );
        }
        let input_shape = manifest.layers[range.start].input_shape.clone();
        // Loading the package charges its weights to the device now, not at the first compute.
        let started = Instant::now();
        let who: Arc<str> = Arc::from(tenant.name.as_str());
        let turn = Arc::clone(&self.ctx.caller.turn);
        let pin = turn
            .off(self.ctx.device.acquire(
                &resolved.id,
                &who,
                &self.ctx.caller.deadline,
                Some(turn.sibling()),
            ))
            .await;
        self.ctx.queue_time += started.elapsed();
        if let Err(e) = pin {
            return self.device_error(e);
        }
        let info = GraphInfo {
            model: resolved.id,
            range,
            input_shape,
            out,
        };
        let charge = self
            .ctx
            .caller
            .account
            .charge(HANDLE_BYTES + info.model.len() as u64, "wasi-nn graph")
            .map_err(trap)?;
        Ok(Ok(self.table.push(Graph {
            info: Arc::new(info),
            charge,
        })?))
    }
}

impl graph::HostGraph for NnView<'_> {
    async fn init_execution_context(
        &mut self,
        graph: Resource<Graph>,
    ) -> Answer<Resource<inference::GraphExecutionContext>> {
        let info = Arc::clone(&self.table.get(&graph)?.info);
        let charge = self
            .ctx
            .caller
            .account
            .charge(HANDLE_BYTES, "wasi-nn execution context")
            .map_err(trap)?;
        Ok(Ok(self.table.push(Context { info, charge })?))
    }

    async fn drop(&mut self, graph: Resource<Graph>) -> wasmtime::Result<()> {
        self.table.delete(graph)?;
        Ok(())
    }
}

impl tensor::Host for NnView<'_> {}

impl tensor::HostTensor for NnView<'_> {
    async fn new(
        &mut self,
        dimensions: TensorDimensions,
        ty: TensorType,
        data: Vec<u8>,
    ) -> wasmtime::Result<Resource<Tensor>> {
        let bytes = HANDLE_BYTES + 4 * dimensions.len() as u64 + data.len() as u64;
        let charge = self
            .ctx
            .caller
            .account
            .charge(bytes, "wasi-nn tensor")
            .map_err(trap)?;
        Ok(self.table.push(Tensor {
            dimensions,
            ty: elem(ty),
            data,
            charge,
        })?)
    }

    async fn dimensions(&mut self, t: Resource<Tensor>) -> wasmtime::Result<TensorDimensions> {
        let dims = &self.table.get(&t)?.dimensions;
        self.ctx
            .caller
            .account
            .check_incoming(4 * dims.len() as u64, "tensor dimensions")
            .map_err(trap)?;
        Ok(dims.clone())
    }

    async fn ty(&mut self, t: Resource<Tensor>) -> wasmtime::Result<TensorType> {
        Ok(wit_type(self.table.get(&t)?.ty))
    }

    async fn data(&mut self, t: Resource<Tensor>) -> wasmtime::Result<Vec<u8>> {
        let data = &self.table.get(&t)?.data;
        self.ctx
            .caller
            .account
            .check_incoming(data.len() as u64, "tensor data")
            .map_err(trap)?;
        Ok(data.clone())
    }

    async fn drop(&mut self, t: Resource<Tensor>) -> wasmtime::Result<()> {
        self.table.delete(t)?;
        Ok(())
    }
}

impl inference::Host for NnView<'_> {}

impl inference::HostGraphExecutionContext for NnView<'_> {
    async fn compute(
        &mut self,
        context: Resource<Context>,
        inputs: Vec<NamedTensor>,
    ) -> Answer<Vec<NamedTensor>> {
        let info = Arc::clone(&self.table.get(&context)?.info);
        // The graph was loaded under the grants in force then; a reload may have taken the
        // model away since.
        let now = self.ctx.caller.tenant_now().map_err(trap)?;
        if !self.ctx.models.may_use(&now, &info.model) {
            self.drop_inputs(inputs);
            return self.error(
                Code::NotFound,
                format!(
                    "a policy reload took model `{}` away from tenant `{}` while its invocation ran",
                    info.model, now.name
                ),
            );
        }
        let mut inputs = inputs;
        if inputs.len() != 1 {
            let got = inputs.len();
            self.drop_inputs(inputs);
            return self.error(
                Code::InvalidArgument,
                format!("compute takes exactly one input tensor, got {got}"),
            );
        }
        let (name, resource) = inputs.remove(0);
        let tensor = self.table.delete(resource)?;
        let n = match check_input(&info, &tensor.dimensions, tensor.ty, tensor.data.len()) {
            Ok(n) => n,
            Err(e) => {
                return self.error(
                    Code::InvalidArgument,
                    format!("input `{}`: {e}", quote(&name)),
                );
            }
        };
        // The input's name is a string of the guest's choosing, as long as its memory, that
        // the host copied and uses for nothing else: not held through the device call.
        drop(name);
        let caller = self.ctx.caller.clone();
        let tenant: Arc<str> = Arc::from(caller.tenant.name.as_str());
        let started = Instant::now();
        let computed = caller.usage.compute();
        let device = Arc::clone(&self.ctx.device);
        let Tensor { data, charge, .. } = tensor;
        // The model's pin and the device call are one wait: no run slot is taken between them.
        let ran = caller
            .turn
            .off(async {
                let pin = device
                    .acquire(
                        &info.model,
                        &tenant,
                        &caller.deadline,
                        Some(caller.turn.sibling()),
                    )
                    .await?;
                let job = Job {
                    tenant: Arc::clone(&tenant),
                    weight: caller.tenant.limits.weight,
                    pin,
                    range: info.range.clone(),
                    input: Input {
                        bytes: data,
                        charge,
                        shape: info.input_shape.clone(),
                        n,
                    },
                    out: info.out,
                    account: Arc::clone(&caller.account),
                    deadline: Arc::clone(&caller.deadline),
                    slot: caller.slot.clone(),
                    usage: Arc::clone(&caller.usage),
                };
                device.run(job).await
            })
            .await;
        // The device added its batches' time to the usage as they ended, those of a call that
        // stopped part way too.
        let ran_for = caller.usage.compute().saturating_sub(computed);
        self.ctx.queue_time += started.elapsed().saturating_sub(ran_for);
        let ran = match ran {
            Ok(r) => r,
            Err(e) => return self.device_error(e),
        };
        let dimensions: Vec<u32> = ran
            .dims
            .iter()
            .map(|&d| u32::try_from(d).unwrap_or(u32::MAX))
            .collect();
        // The output's bytes were charged before the call was admitted; add its handle.
        let handle = caller
            .account
            .charge(HANDLE_BYTES + 4 * dimensions.len() as u64, "wasi-nn tensor")
            .map_err(trap)?;
        let out = self.table.push(Tensor {
            dimensions,
            ty: match info.out {
                WireDtype::F32 => ElemType::Fp32,
                WireDtype::F16 => ElemType::Fp16,
                WireDtype::Bf16 => ElemType::Bf16,
                // Never a graph's output type (see `split_out_kind`).
                WireDtype::Int8 => ElemType::U8,
            },
            data: ran.output,
            charge: ran.charge.absorb(handle),
        })?;
        Ok(Ok(vec![("output".to_string(), out)]))
    }

    async fn drop(&mut self, context: Resource<Context>) -> wasmtime::Result<()> {
        self.table.delete(context)?;
        Ok(())
    }
}

impl errors::Host for NnView<'_> {}

impl errors::HostError for NnView<'_> {
    async fn code(&mut self, e: Resource<NnError>) -> wasmtime::Result<ErrorCode> {
        Ok(wit_code(self.table.get(&e)?.code))
    }

    async fn data(&mut self, e: Resource<NnError>) -> wasmtime::Result<String> {
        let m = &self.table.get(&e)?.message;
        self.ctx
            .caller
            .account
            .check_incoming(m.len() as u64, "wasi-nn error message")
            .map_err(trap)?;
        Ok(m.clone())
    }

    async fn drop(&mut self, e: Resource<NnError>) -> wasmtime::Result<()> {
        self.table.delete(e)?;
        Ok(())
    }
}
