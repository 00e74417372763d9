//! The Wasm side of the host: one engine, tenants' components compiled and pre-instantiated
//! once, and a fresh, limited store per invocation.

use crate::device::DeviceError;
use crate::models::Models;
use crate::nn::Executor;
use crate::objects::{ObjectError, Objects, Store as ObjectRoot};
use crate::policy::Tenant;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

pub mod bindings {
    wasmtime::component::bindgen!({
        world: "hapi:pushdown/pushdown",
        path: "../wit",
        imports: { default: trappable },
        with: {
            "wasi:nn/graph.graph": crate::nn::Graph,
            "wasi:nn/tensor.tensor": crate::nn::Tensor,
            "wasi:nn/inference.graph-execution-context": crate::nn::Context,
            "wasi:nn/errors.error": crate::nn::NnError,
        },
    });
}

pub use bindings::hapi::pushdown::types::{
    ElementType, Error as GuestError, Invocation, TensorOut,
};
use bindings::hapi::pushdown::{models as wit_models, objects as wit_objects, types as wit_types};

/// Epoch tick: the granularity of invocation deadlines.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Instances alive at once across all tenants (pooling allocator slots).
pub const MAX_INSTANCES: u32 = 256;
/// Largest table a guest may grow to (entries).
pub const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Most keys in one invocation.
pub const MAX_KEYS: usize = 4096;

/// Why the host stopped a guest.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Trap {
    #[error("memory limit of {limit} bytes exceeded")]
    MemoryLimit { limit: u64 },
    #[error("tensors held in the host exceed the memory limit of {limit} bytes")]
    TensorMemory { limit: u64 },
    #[error("table limit of {MAX_TABLE_ELEMENTS} elements exceeded")]
    TableLimit,
}

/// What one invocation gave: its output or error, its timings, the object bytes it read, and
/// the device's refusal of a compute call, if there was one (the host's answer then overrides
/// whatever the guest made of it).
#[derive(Debug)]
pub struct Finished {
    pub result: Result<TensorOut, InvokeError>,
    pub timings: Timings,
    pub read: u64,
    pub refused: Option<DeviceError>,
}

/// Time spent in each stage of one invocation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub instantiate: Duration,
    pub read: Duration,
    pub compute: Duration,
    /// Waiting for the host: for the device (memory, batch mates) and for a model's first
    /// load and memory measurement. Not charged to the time limit.
    pub queued: Duration,
    pub total: Duration,
}

impl Timings {
    /// Guest time outside host calls: decoding and preprocessing, mostly.
    pub fn guest(&self) -> Duration {
        self.total
            .saturating_sub(self.instantiate + self.read + self.compute + self.queued)
    }
}

#[derive(Debug)]
struct Limiter {
    memory: u64,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory {
            wasmtime::bail!(Trap::MemoryLimit { limit: self.memory });
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            wasmtime::bail!(Trap::TableLimit);
        }
        Ok(true)
    }
}

/// Everything one invocation's store holds.
pub struct State {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    limiter: Limiter,
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) models: Arc<Models>,
    pub(crate) executor: Arc<dyn Executor>,
    objects: Objects,
    /// Tensor bytes held in the host for this guest.
    pub(crate) nn_bytes: u64,
    pub(crate) timings: Timings,
    /// Set when the device refused a compute call: the host answers for it.
    pub(crate) refused: Option<DeviceError>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("tenant", &self.tenant.name)
            .field("nn_bytes", &self.nn_bytes)
            .finish_non_exhaustive()
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn to_wit(e: ObjectError) -> wit_objects::ObjectError {
    match e {
        ObjectError::NotFound(m) => wit_objects::ObjectError::NotFound(m),
        ObjectError::Denied(m) => wit_objects::ObjectError::Denied(m),
        ObjectError::TooLarge(n) => wit_objects::ObjectError::TooLarge(n),
        ObjectError::Io(m) => wit_objects::ObjectError::Io(m),
    }
}

fn meta(m: crate::objects::ObjectMeta) -> wit_objects::ObjectMeta {
    wit_objects::ObjectMeta {
        key: m.key,
        size: m.size,
        last_modified_ms: m.last_modified_ms,
        etag: m.etag,
    }
}

impl State {
    fn timed<T>(&mut self, f: impl FnOnce(&mut Objects) -> T) -> T {
        let started = Instant::now();
        let out = f(&mut self.objects);
        self.timings.read += started.elapsed();
        out
    }
}

impl wit_objects::Host for State {
    fn get(
        &mut self,
        bucket: String,
        key: String,
    ) -> wasmtime::Result<Result<Vec<u8>, wit_objects::ObjectError>> {
        Ok(self.timed(|o| o.get(&bucket, &key)).map_err(to_wit))
    }

    fn get_range(
        &mut self,
        bucket: String,
        key: String,
        offset: u64,
        length: u64,
    ) -> wasmtime::Result<Result<Vec<u8>, wit_objects::ObjectError>> {
        Ok(self
            .timed(|o| o.get_range(&bucket, &key, offset, length))
            .map_err(to_wit))
    }

    fn head(
        &mut self,
        bucket: String,
        key: String,
    ) -> wasmtime::Result<Result<wit_objects::ObjectMeta, wit_objects::ObjectError>> {
        Ok(self
            .timed(|o| o.head(&bucket, &key))
            .map(meta)
            .map_err(to_wit))
    }

    fn list(
        &mut self,
        bucket: String,
        prefix: String,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<wit_objects::ObjectMeta>, wit_objects::ObjectError>> {
        Ok(self
            .timed(|o| o.list(&bucket, &prefix, limit))
            .map(|v| v.into_iter().map(meta).collect())
            .map_err(to_wit))
    }
}

impl wit_models::Host for State {
    fn describe(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<wit_models::ModelInfo, String>> {
        if !self.tenant.models.contains(&name) {
            return Ok(Err(format!(
                "model `{name}` is not one tenant `{}` may use",
                self.tenant.name
            )));
        }
        let Some(m) = self.models.manifest(&name) else {
            return Ok(Err(format!("no model `{name}` on this host")));
        };
        let dim = |i: usize| m.input.shape.get(i).map_or(0, |&d| d as u32);
        Ok(Ok(wit_models::ModelInfo {
            name: m.name.clone(),
            layers: m.layers.len() as u32,
            freeze_index: m.freeze_index as u32,
            input: wit_models::InputSpec {
                channels: dim(0),
                height: dim(1),
                width: dim(2),
                resize: m.input.resize,
                crop: m.input.crop,
                mean: m.input.mean.to_vec(),
                std: m.input.std.to_vec(),
            },
        }))
    }
}

impl wit_types::Host for State {}

/// A tenant's deployed function, compiled and pre-instantiated.
#[derive(Clone)]
pub struct Function {
    pub name: String,
    pub sha256: String,
    pub size: usize,
    pre: bindings::PushdownPre<State>,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Why a component cannot be deployed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("not WebAssembly (no `\\0asm` header)")]
    NotWasm,
    #[error(
        "a core Wasm module, not a component: build with `cargo build --target wasm32-wasip2` or `cargo component build`"
    )]
    CoreModule,
    #[error("does not compile: {0}")]
    Invalid(String),
    #[error("imports interfaces tenant `{tenant}` is not granted: {imports}")]
    NotGranted { tenant: String, imports: String },
    #[error("does not implement the `hapi:pushdown/pushdown` world: {0}")]
    WrongWorld(String),
}

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("{0}")]
    Guest(GuestErrorMessage),
    #[error("time limit of {0:?} exceeded")]
    TimeLimit(Duration),
    #[error("{0}")]
    Limit(Trap),
    #[error("output is {size} bytes, over the limit of {limit}")]
    OutputTooLarge { size: u64, limit: u64 },
    #[error("output tensor is malformed: {0}")]
    BadOutput(String),
    #[error("the function trapped: {0}")]
    GuestTrap(String),
    #[error("host error: {0}")]
    Host(String),
}

/// A guest's typed error, rendered for clients.
#[derive(Debug)]
pub struct GuestErrorMessage(pub GuestError);

impl std::fmt::Display for GuestErrorMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use wit_objects::ObjectError as O;
        match &self.0 {
            GuestError::BadRequest(m) => write!(f, "bad request: {m}"),
            GuestError::BadObject(m) => write!(f, "bad object: {m}"),
            GuestError::Inference(m) => write!(f, "inference failed: {m}"),
            GuestError::Object(O::NotFound(m)) => write!(f, "object not found: {m}"),
            GuestError::Object(O::Denied(m)) => write!(f, "access denied: {m}"),
            GuestError::Object(O::TooLarge(n)) => write!(f, "read over the byte cap of {n}"),
            GuestError::Object(O::Io(m)) => write!(f, "object store error: {m}"),
        }
    }
}

/// The engine, the linker and what every store needs.
pub struct Runtime {
    engine: Engine,
    linker: Linker<State>,
    models: Arc<Models>,
    objects: Arc<ObjectRoot>,
    executor: Arc<dyn Executor>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

/// Interfaces every tenant's component may import: the contract, wasi-nn, and the stdio,
/// environment and exit interfaces Rust's std links (the host gives them nothing: no
/// variables, no arguments, empty stdin, discarded output).
const ALWAYS: &[&str] = &["hapi:pushdown/", "wasi:nn/", "wasi:io/", "wasi:cli/"];

impl Runtime {
    pub fn new(
        models: Arc<Models>,
        objects: Arc<ObjectRoot>,
        executor: Arc<dyn Executor>,
    ) -> anyhow::Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(MAX_INSTANCES)
            .total_core_instances(MAX_INSTANCES * 4)
            .total_memories(MAX_INSTANCES)
            .total_tables(MAX_INSTANCES * 2)
            .max_memory_size(crate::policy::MAX_GUEST_MEMORY as usize);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(wasm_err)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(wasm_err)?;
        bindings::Pushdown::add_to_linker::<State, wasmtime::component::HasSelf<State>>(
            &mut linker,
            |s| s,
        )
        .map_err(wasm_err)?;
        // The epoch clock: deadlines are counted in ticks of EPOCH_TICK of wall time. When the
        // ticker oversleeps (a loaded machine), it catches up, so deadlines do not stretch.
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                let mut next = Instant::now() + EPOCH_TICK;
                while let Some(engine) = ticker.upgrade() {
                    while Instant::now() >= next {
                        engine.increment_epoch();
                        next += EPOCH_TICK;
                    }
                    drop(engine);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            })?;
        Ok(Self {
            engine,
            linker,
            models,
            objects,
            executor,
        })
    }

    pub fn models(&self) -> &Arc<Models> {
        &self.models
    }

    /// Compiles `bytes`, or loads the machine code an earlier compilation left in `cache`
    /// (keyed by the component's digest and the engine's compatibility hash).
    fn component(
        &self,
        bytes: &[u8],
        sha256: &str,
        cache: Option<&Path>,
    ) -> Result<Component, DeployError> {
        let cached = cache.map(|dir| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            self.engine.precompile_compatibility_hash().hash(&mut h);
            dir.join(format!("{sha256}-{:016x}.cwasm", h.finish()))
        });
        if let Some(path) = cached.as_ref().filter(|p| p.exists()) {
            // SAFETY: the file was written by `Component::serialize` of an engine with the same
            // compatibility hash, into the host's own state directory.
            match unsafe { Component::deserialize_file(&self.engine, path) } {
                Ok(c) => return Ok(c),
                Err(e) => tracing::warn!("ignoring {}: {e}", path.display()),
            }
        }
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| DeployError::Invalid(format!("{e:#}")))?;
        if let Some(path) = cached {
            let written = component
                .serialize()
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|code| {
                    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
                    let tmp = path.with_extension("tmp");
                    std::fs::write(&tmp, code)?;
                    std::fs::rename(&tmp, &path)
                });
            if let Err(e) = written {
                tracing::warn!("not caching compiled code at {}: {e}", path.display());
            }
        }
        Ok(component)
    }

    /// Validates, compiles (or loads from `cache`) and pre-instantiates a component for
    /// `tenant`.
    pub fn compile(
        &self,
        tenant: &Tenant,
        name: &str,
        bytes: &[u8],
        cache: Option<&Path>,
    ) -> Result<Function, DeployError> {
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return Err(DeployError::NotWasm);
        }
        if bytes[4..8] == [1, 0, 0, 0] {
            return Err(DeployError::CoreModule);
        }
        let sha256 = crate::policy::hash_bytes(bytes);
        let component = self.component(bytes, &sha256, cache)?;
        let mut allowed: Vec<&str> = ALWAYS.to_vec();
        if tenant.capabilities.clocks {
            allowed.push("wasi:clocks/");
        }
        if tenant.capabilities.random {
            allowed.push("wasi:random/");
        }
        let denied: Vec<String> = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .filter(|name| !allowed.iter().any(|p| name.starts_with(p)))
            .collect();
        if !denied.is_empty() {
            return Err(DeployError::NotGranted {
                tenant: tenant.name.clone(),
                imports: denied.join(", "),
            });
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .and_then(bindings::PushdownPre::new)
            .map_err(|e| DeployError::WrongWorld(format!("{e:#}")))?;
        Ok(Function {
            name: name.to_string(),
            sha256,
            size: bytes.len(),
            pre,
        })
    }

    /// Runs `function` for `tenant` in a fresh store with the tenant's limits.
    pub fn invoke(
        &self,
        tenant: &Arc<Tenant>,
        function: &Function,
        invocation: &Invocation,
    ) -> Finished {
        let started = Instant::now();
        let limits = &tenant.limits;
        let state = State {
            wasi: WasiCtxBuilder::new().build(),
            table: ResourceTable::new(),
            limiter: Limiter {
                memory: limits.memory,
            },
            tenant: Arc::clone(tenant),
            models: Arc::clone(&self.models),
            executor: Arc::clone(&self.executor),
            objects: Objects::new(Arc::clone(tenant), Arc::clone(&self.objects)),
            nn_bytes: 0,
            timings: Timings::default(),
            refused: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // The next tick may come at any moment, so one tick more than the timeout holds: the
        // guest gets at least its whole timeout and at most one tick beyond it. Time spent
        // waiting for the device is the host's, not the guest's: at the deadline, the guest
        // gets that time back.
        let ticks = limits.timeout.as_millis().div_ceil(EPOCH_TICK.as_millis()) as u64 + 1;
        store.set_epoch_deadline(ticks);
        let timeout = limits.timeout;
        store.epoch_deadline_callback(move |ctx| {
            let used = started.elapsed().saturating_sub(ctx.data().timings.queued);
            if used >= timeout {
                return Ok(wasmtime::UpdateDeadline::Interrupt);
            }
            let left = (timeout - used)
                .as_millis()
                .div_ceil(EPOCH_TICK.as_millis()) as u64;
            Ok(wasmtime::UpdateDeadline::Continue(left.max(1)))
        });

        let result = function
            .pre
            .instantiate(&mut store)
            .map_err(|e| classify(e, limits.timeout))
            .and_then(|instance| {
                store.data_mut().timings.instantiate = started.elapsed();
                instance
                    .call_run(&mut store, invocation)
                    .map_err(|e| classify(e, limits.timeout))
            })
            .and_then(|r| r.map_err(|e| InvokeError::Guest(GuestErrorMessage(e))))
            .and_then(|out| check_output(out, limits.max_output));
        let data = store.data_mut();
        let mut timings = data.timings;
        timings.total = started.elapsed();
        Finished {
            result,
            timings,
            read: data.objects.bytes_read,
            refused: data.refused.take(),
        }
    }
}

fn wasm_err(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{e:#}")
}

fn classify(e: wasmtime::Error, timeout: Duration) -> InvokeError {
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return InvokeError::Limit(trap.clone());
    }
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return InvokeError::TimeLimit(timeout);
    }
    if e.downcast_ref::<wasmtime::Trap>().is_some() {
        return InvokeError::GuestTrap(format!("{e:#}"));
    }
    // Anything else from inside a call (a resource-table misuse, a host call error) is the
    // guest's doing as far as the caller is concerned; the host itself is unaffected.
    InvokeError::GuestTrap(format!("{e:#}"))
}

fn check_output(out: TensorOut, limit: u64) -> Result<TensorOut, InvokeError> {
    let size = out.data.len() as u64;
    if size > limit {
        return Err(InvokeError::OutputTooLarge { size, limit });
    }
    let elem = match out.ty {
        ElementType::F32 => 4u64,
        ElementType::U8 => 1,
        ElementType::I64 => 8,
    };
    let elements = out
        .dimensions
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)));
    match elements.and_then(|e| e.checked_mul(elem)) {
        Some(n) if n == size && !out.dimensions.is_empty() => Ok(out),
        _ => Err(InvokeError::BadOutput(format!(
            "dimensions {:?} of {:?} do not match {size} bytes of data",
            out.dimensions, out.ty
        ))),
    }
}

/// The functions deployed for each tenant: tenant -> name -> function.
pub type FunctionTable = BTreeMap<String, BTreeMap<String, Function>>;
