//! An invocation: a fresh store with the tenant's limits and capabilities, the function's `run`
//! called in it, and its output checked and encoded, all before the invocation's deadline.
//!
//! Invocations run on a runtime of their own ([`Runtime`]'s workers), so that guests never
//! delay the HTTP server. A guest yields to other invocations every epoch tick; at its deadline
//! it is stopped wherever it is (in guest code, by epoch interruption; in a host call, by
//! dropping the call, which cancels whatever the host was doing for it).

use crate::account::Charge;
use crate::account::{Account, Deadline, Usage};
use crate::admission::Permit;
use crate::bindings::hapi::pushdown::types::{Output as GuestOutput, TensorOut};
use crate::bindings::{ElementType, Invocation, PushdownPre};
use crate::caps::caller::{Caller, Stop};
use crate::caps::models::ModelsCtx;
use crate::caps::nn::NnCtx;
use crate::caps::nn::host::NnView;
use crate::caps::nn::resources::ElemType;
use crate::caps::objects::ObjectsCtx;
use crate::device::Device;
use crate::models::Models;
use crate::policy::{Capabilities, Current, Tenant};
use crate::store::Store as ObjectStore;
use crate::wasm::compile::DeployError;
use crate::wasm::cpu::{CpuShares, Turn};
use crate::wasm::errors::{InvokeError, Witness, classify_trap, guest_error};
use crate::wasm::limits::{Limiter, MAX_HANDLES, MAX_RANDOM_BYTES};
use hapi_wire::invoke::Quantize;
use hapi_wire::quantize::{Cursor, Plan};
use hapi_wire::tensor::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasData, Linker, ResourceTable};
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// How long past its deadline the guard around a whole invocation waits before dropping it:
/// long enough for the checks inside (the epoch callback, a host call's own wait) to stop it
/// first and say where, short enough that no call outlives its limit by much.
pub const GUARD_GRACE: Duration = Duration::from_millis(100);

/// Everything one invocation's store holds.
pub struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    objects: ObjectsCtx,
    models: ModelsCtx,
    nn: NnCtx,
    /// The invocation's run slot, given back while the guest blocks in `wasi:io/poll`.
    turn: Arc<Turn>,
    /// The invocation's time limit (for the stop a `wasi:io/poll` past its deadline makes).
    limit: Duration,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").finish_non_exhaustive()
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

/// Blocking threads of the invocation workers' runtime for a pool of `instances`: the local
/// store's jobs and models' loads run there (a job told to wait for its tenant's turn gives its
/// thread back and waits off it: `Pace::try_pace`). Every invocation may have one job in
/// flight, and one more may still be ending after its invocation was dropped (a client that
/// hung up); so twice the pool, and room for loads and profiles (whose layers wait for their
/// turn on their thread). Threads are made only as needed.
fn blocking_threads(instances: u32) -> usize {
    usize::try_from(instances)
        .unwrap_or(usize::MAX)
        .saturating_mul(2)
        .saturating_add(64)
        .max(512)
}

/// An invocation's WASI context: no environment, arguments or stdin; stdout and stderr
/// [`Discard`]; random bytes at most `MAX_RANDOM_BYTES` a call. The hash-map seed every
/// component may ask for is `seed`, its function's ([`Prepared`]), for a component not granted
/// `random` (`None`: wasmtime's, drawn afresh for every context, which gave 128 bits of
/// entropy to every invocation whatever its tenant was granted).
fn wasi_ctx(seed: Option<u128>) -> WasiCtx {
    let mut ctx = WasiCtxBuilder::new();
    ctx.stdout(Discard)
        .stderr(Discard)
        .max_random_size(MAX_RANDOM_BYTES);
    if let Some(seed) = seed {
        ctx.insecure_random_seed(seed);
    }
    ctx.build()
}

/// The hash-map seed of `tenant`'s function whose code hashes to `sha256`, for a component
/// not granted `random`: the same at every invocation, and known to no one else (`key` is
/// drawn when the host starts). One public value (as first fixed) let anyone whose data a
/// function puts in a `HashMap` (objects' keys or contents) choose colliding data, and slow the
/// function to its time limit; one per code digest (as fixed next) was shared by every tenant
/// running the same bytes (the shipped guests), so that one tenant's copy stood in for
/// another's.
fn function_seed(key: &std::hash::RandomState, tenant: &str, sha256: &str) -> u128 {
    use std::hash::BuildHasher;
    let half = |i: u8| u128::from(key.hash_one((i, tenant, sha256)));
    (half(0) << 64) | half(1)
}

/// Most bytes a guest may write to stdout or stderr in one call (what `check-write` grants;
/// wasi:io's blocking writes allow no more either).
const DISCARD_PERMIT: usize = 4096;

/// A guest's stdout and stderr: what it writes is dropped, and nothing is allocated for it.
/// The bound is the host's own, not the default sink's: `write-zeroes` asks for a length the
/// guest chooses (a `u64`) and wasi-io's default allocates that many zeroes if the stream's
/// `check-write` allows it. wasmtime's sink allows 64 KiB in 48.0.8 and `usize::MAX` on its
/// main branch, where one call of 2^48 would abort the host (allocation failure), charged to
/// no tenant and past any time limit (the call is synchronous).
#[derive(Clone, Copy, Debug)]
struct Discard;

impl wasmtime_wasi::cli::IsTerminal for Discard {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for Discard {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }

    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(Discard)
    }
}

impl Discard {
    fn within(n: usize) -> wasmtime_wasi::p2::StreamResult<()> {
        if n > DISCARD_PERMIT {
            return Err(wasmtime_wasi::p2::StreamError::trap(&format!(
                "a write of {n} bytes to stdout or stderr, past the {DISCARD_PERMIT} that \
                 check-write allows"
            )));
        }
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::OutputStream for Discard {
    fn write(&mut self, bytes: bytes::Bytes) -> wasmtime_wasi::p2::StreamResult<()> {
        Self::within(bytes.len())
    }

    fn flush(&mut self) -> wasmtime_wasi::p2::StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> wasmtime_wasi::p2::StreamResult<usize> {
        Ok(DISCARD_PERMIT)
    }

    fn write_zeroes(&mut self, nelem: usize) -> wasmtime_wasi::p2::StreamResult<()> {
        Self::within(nelem)
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for Discard {
    async fn ready(&mut self) {}
}

/// wasi:io's data: the handle table.
struct HasTable;

impl HasData for HasTable {
    type Data<'a> = &'a mut ResourceTable;
}

/// A linker for components granted `caps`: the contract, wasi-nn, the stdio, environment and
/// exit interfaces of Rust's std (which get nothing: no variables, no arguments, empty stdin,
/// discarded output), std's hash-map seed (`wasi:random/insecure-seed`), and clocks or random
/// where granted. Nothing else is linked, so a
/// component importing anything more cannot be instantiated whatever slipped past the checks.
fn linker(engine: &Engine, caps: Capabilities) -> wasmtime::Result<Linker<State>> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::p2::bindings::{cli, clocks, io, random};
    use wasmtime_wasi::random::{WasiRandom, WasiRandomView};
    let mut l = Linker::new(engine);
    io::error::add_to_linker::<State, HasTable>(&mut l, |s| &mut s.table)?;
    io::poll::add_to_linker::<State, super::poll::HasBounded>(&mut l, |s| super::poll::Bounded {
        table: &mut s.table,
        turn: &s.turn,
        limit: s.limit,
    })?;
    io::streams::add_to_linker::<State, HasTable>(&mut l, |s| &mut s.table)?;
    cli::exit::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::environment::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::stdin::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::stdout::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::stderr::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::terminal_input::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::terminal_output::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::terminal_stdin::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::terminal_stdout::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    cli::terminal_stderr::add_to_linker::<State, WasiCli>(&mut l, State::cli)?;
    if caps.clocks {
        clocks::wall_clock::add_to_linker::<State, WasiClocks>(&mut l, State::clocks)?;
        clocks::monotonic_clock::add_to_linker::<State, WasiClocks>(&mut l, State::clocks)?;
    }
    // The per-instance seed Rust's std asks for to key a HashMap (on wasm32-wasip2 every
    // `HashMap::new` does): one 128-bit value fixed when the instance is made, the same for
    // every instance of a function without `random` (`wasi_ctx`). Every component gets it, so
    // that a function may use std's collections.
    random::insecure_seed::add_to_linker::<State, WasiRandom>(&mut l, State::random)?;
    if caps.random {
        random::random::add_to_linker::<State, WasiRandom>(&mut l, State::random)?;
        random::insecure::add_to_linker::<State, WasiRandom>(&mut l, State::random)?;
    }
    crate::caps::objects::add_to_linker(&mut l, |s| &mut s.objects)?;
    crate::caps::models::add_to_linker(&mut l, |s| &mut s.models)?;
    crate::caps::nn::add_to_linker(&mut l, |s| NnView {
        ctx: &mut s.nn,
        table: &mut s.table,
    })?;
    crate::bindings::hapi::pushdown::types::add_to_linker::<State, crate::caps::objects::Objects>(
        &mut l,
        |s| &mut s.objects,
    )?;
    Ok(l)
}

/// Interface prefixes a component granted `caps` may import (checked before compiling).
pub fn allowed_imports(caps: Capabilities) -> Vec<&'static str> {
    let mut allowed = vec![
        "hapi:pushdown/",
        "wasi:nn/",
        "wasi:io/",
        "wasi:cli/",
        "wasi:random/insecure-seed@",
    ];
    if caps.clocks {
        allowed.push("wasi:clocks/");
    }
    if caps.random {
        allowed.push("wasi:random/");
    }
    allowed
}

/// A component ready to instantiate for a tenant.
#[derive(Clone)]
pub struct Prepared {
    pre: PushdownPre<State>,
    /// Its hash-map seed, when it is not linked with `wasi:random` ([`function_seed`]).
    seed: Option<u128>,
}

impl Prepared {
    /// The compiled component (cheap to clone: clones share its code in memory).
    pub fn component(&self) -> &Component {
        self.pre.instance_pre().component()
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").finish_non_exhaustive()
    }
}

/// The encoded response of a successful invocation: a safetensors header and the tensor's
/// bytes, sent one after the other.
#[derive(Debug)]
pub struct Output {
    pub header: Vec<u8>,
    pub data: Vec<u8>,
}

impl Output {
    pub fn len(&self) -> u64 {
        (self.header.len() + self.data.len()) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Time spent in each stage of an invocation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub instantiate: Duration,
    pub read: Duration,
    pub queue: Duration,
    pub compute: Duration,
    pub total: Duration,
}

impl Timings {
    /// Guest time outside host calls: decoding and preprocessing, mostly.
    pub fn guest(&self) -> Duration {
        self.total
            .saturating_sub(self.instantiate + self.read + self.compute + self.queue)
    }
}

/// Bytes an invocation's request holds: its strings, each with its `String`.
fn request_bytes(inv: &Invocation) -> u64 {
    let text = crate::store::error::string_bytes;
    text(&inv.bucket)
        + inv.model.as_deref().map_or(0, text)
        + inv.keys.iter().map(|k| text(k)).sum::<u64>()
        + inv
            .options
            .iter()
            .map(|(k, v)| text(k) + text(v))
            .sum::<u64>()
}

/// What one invocation gave.
#[derive(Debug)]
pub struct Finished {
    pub result: Result<Output, InvokeError>,
    pub timings: Timings,
    /// Object bytes read.
    pub read: u64,
    /// Most memory the invocation held at once (guest and host).
    pub memory_peak: u64,
}

impl Finished {
    /// An invocation that ended in `error` with nothing measured but its wall time since
    /// `started` (its slot never came, the workers stopped, its task panicked, its request
    /// went away).
    fn failed(error: InvokeError, started: Instant) -> Self {
        Self {
            result: Err(error),
            timings: Timings {
                total: started.elapsed(),
                ..Timings::default()
            },
            read: 0,
            memory_peak: 0,
        }
    }
}

/// The engine, the linkers and what every store needs.
pub struct Runtime {
    engine: Engine,
    /// The policy in force: invocations' host calls read their tenant's grants from it.
    policy: Arc<Current>,
    linkers: HashMap<Capabilities, Linker<State>>,
    models: Arc<Models>,
    objects: Arc<ObjectStore>,
    device: Arc<Device>,
    /// Runs invocations; `Some` until dropped.
    workers: Option<tokio::runtime::Runtime>,
    /// The workers' run slots, shared by tenant.
    cpu: Arc<CpuShares>,
    /// Drawn at start: the key of the functions' hash-map seeds ([`function_seed`]).
    seeds: std::hash::RandomState,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Drop for Runtime {
    /// A runtime's own drop blocks on its workers and panics on an async thread, where a host
    /// may well be dropped; this one does neither.
    fn drop(&mut self) {
        if let Some(rt) = self.workers.take() {
            rt.shutdown_background();
        }
    }
}

impl Runtime {
    pub fn new(
        engine: Engine,
        policy: Arc<Current>,
        models: Arc<Models>,
        objects: Arc<ObjectStore>,
        device: Arc<Device>,
        workers: usize,
        instances: u32,
    ) -> anyhow::Result<Self> {
        let mut linkers = HashMap::new();
        for clocks in [false, true] {
            for random in [false, true] {
                let caps = Capabilities { clocks, random };
                let l = linker(&engine, caps).map_err(|e| anyhow::anyhow!("{e:#}"))?;
                linkers.insert(caps, l);
            }
        }
        let cpu = CpuShares::new(workers.max(1));
        let workers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .max_blocking_threads(blocking_threads(instances))
            .thread_name("hapi-invoke")
            .enable_all()
            .build()?;
        Ok(Self {
            engine,
            policy,
            linkers,
            models,
            objects,
            device,
            workers: Some(workers),
            cpu,
            seeds: std::hash::RandomState::new(),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The invocation workers' shares.
    pub fn cpu(&self) -> &Arc<CpuShares> {
        &self.cpu
    }

    pub fn models(&self) -> &Arc<Models> {
        &self.models
    }

    /// A place in the workers' shares for host work on `tenant`'s behalf outside an invocation
    /// (a profile's load and measurement), until `until`.
    pub fn share_for(&self, tenant: &Tenant, until: Instant) -> Arc<Turn> {
        Turn::new(&self.cpu, &tenant.name, tenant.limits.weight, until)
    }

    pub fn objects(&self) -> &Arc<ObjectStore> {
        &self.objects
    }

    /// Pre-instantiates a compiled component (whose code hashes to `sha256`) for `tenant`,
    /// granted `caps`: fails if it does not implement the world with what those capabilities
    /// link.
    pub fn prepare(
        &self,
        caps: Capabilities,
        component: &Component,
        (tenant, sha256): (&str, &str),
    ) -> Result<Prepared, DeployError> {
        let linker = self
            .linkers
            .get(&caps)
            .ok_or_else(|| DeployError::WrongWorld("no linker for these capabilities".into()))?;
        let pre = linker
            .instantiate_pre(component)
            .and_then(PushdownPre::new)
            .map_err(|e| DeployError::WrongWorld(crate::account::text::bounded_display(&e)))?;
        Ok(Prepared {
            pre,
            seed: (!caps.random).then(|| function_seed(&self.seeds, tenant, sha256)),
        })
    }

    /// Runs `function` for `tenant` on the invocation workers; `reply` says how its output is
    /// sent, what it reads and computes into `usage` as it goes. Dropping the returned future
    /// stops the invocation.
    pub async fn invoke(
        &self,
        tenant: &Arc<Tenant>,
        function: &Prepared,
        invocation: Invocation,
        reply: Reply,
        usage: Arc<Usage>,
        slot: Option<Arc<Permit>>,
    ) -> Finished {
        let started = Instant::now();
        // The run slot is taken here, before a worker picks the invocation up: its tenant
        // counts as wanting the workers from now, so that the others' shares shrink at their
        // next tick rather than once this one has waited for a worker behind them.
        let limit = tenant.limits.timeout;
        let turn = Turn::new(
            &self.cpu,
            &tenant.name,
            tenant.limits.weight,
            started + limit,
        );
        if !turn.take().await {
            let during = "waiting for its tenant's share of the workers";
            let stop = InvokeError::Stopped(Stop::Time { limit, during });
            return Finished::failed(stop, started);
        }
        // When the request waiting for it goes away (`stop` dropped with this future), the
        // invocation stops at its next poll and frees its memory on a slot of its tenant's
        // share. Its task was aborted, and its memory freed where it stood: on a worker and no
        // slot, when it waited in a host call.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let job = run(
            Arc::clone(tenant),
            Arc::clone(&self.policy),
            function.pre.clone(),
            function.seed,
            invocation,
            reply,
            usage,
            slot,
            Arc::clone(&self.models),
            Arc::clone(&self.objects),
            Arc::clone(&self.device),
            turn,
            started,
            stopped,
        );
        let Some(workers) = self.workers.as_ref() else {
            let stopped = InvokeError::HostFault("the invocation workers stopped".into());
            return Finished::failed(stopped, started);
        };
        let handle = workers.spawn(job);
        let _stop = stop;
        match handle.await {
            Ok(f) => f,
            // A panic of the task (or the workers shutting down): what it had measured went
            // with it.
            Err(e) => {
                let fault = InvokeError::HostFault(format!("invocation task: {e}"));
                Finished::failed(fault, started)
            }
        }
    }
}

/// One invocation, start to end.
#[allow(clippy::too_many_arguments)]
async fn run(
    tenant: Arc<Tenant>,
    policy: Arc<Current>,
    pre: PushdownPre<State>,
    seed: Option<u128>,
    invocation: Invocation,
    reply: Reply,
    usage: Arc<Usage>,
    slot: Option<Arc<Permit>>,
    models: Arc<Models>,
    objects: Arc<ObjectStore>,
    device: Arc<Device>,
    turn: Arc<Turn>,
    started: Instant,
    mut stopped: Stopped,
) -> Finished {
    let limits = &tenant.limits;
    let deadline = Arc::new(Deadline::starting_at(started, limits.timeout));
    let account = Account::new(limits.memory);
    // The request, held here while the function runs (up to 4,096 keys of 1 KiB and 64 options
    // of 8 KiB): the tenant's too, beside the guest's own copy in its memory.
    let _request =
        match account.charge(request_bytes(&invocation), "the request's keys and options") {
            Ok(held) => held,
            Err(e) => return Finished::failed(InvokeError::Stopped(Stop::from(e)), started),
        };
    let caller = Caller {
        tenant: Arc::clone(&tenant),
        policy,
        account: Arc::clone(&account),
        deadline: Arc::clone(&deadline),
        usage: Arc::clone(&usage),
        turn: Arc::clone(&turn),
        slot,
    };
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_HANDLES);
    let state = State {
        wasi: wasi_ctx(seed),
        table,
        limiter: Limiter::new(Arc::clone(&account)),
        objects: ObjectsCtx::new(caller.clone(), objects),
        models: ModelsCtx::new(caller.clone(), Arc::clone(&models)),
        nn: NnCtx::new(caller, device, models),
        turn: Arc::clone(&turn),
        limit: limits.timeout,
    };
    let mut store = Store::new(pre.engine(), state);
    store.limiter(|s| &mut s.limiter);
    // What one host call's arguments may lift into host memory, whatever the guest holds: its
    // lists may all point at one buffer (wasmtime's default is 128 MiB, whatever the limit).
    store.set_hostcall_fuel(usize::try_from(limits.memory).unwrap_or(usize::MAX));
    // Handles in the component's own tables, those of resources the guest defines itself
    // included (`resource.new` needs no host call): the host's bound, not wasmtime's 100,000.
    store.set_max_component_handles(MAX_HANDLES);
    // Every tick: stop the guest past its deadline, else let other invocations run, and take
    // a run slot again when the tenant's share of the workers allows (`cpu`).
    store.set_epoch_deadline(1);
    let d = Arc::clone(&deadline);
    let t = Arc::clone(&turn);
    store.epoch_deadline_callback(move |_| {
        Ok(if d.expired() {
            UpdateDeadline::Interrupt
        } else {
            let t = Arc::clone(&t);
            UpdateDeadline::YieldCustom(1, Box::pin(async move { t.tick().await }))
        })
    });
    let mut instantiated = Duration::ZERO;
    let call = deadline.run_past(
        async {
            let instance = pre.instantiate_async(&mut store).await?;
            instantiated = started.elapsed();
            instance.call_run(&mut store, &invocation).await
        },
        GUARD_GRACE,
    );
    // Nobody waits for this answer.
    let gone = || InvokeError::HostFault("its request went away".into());
    let Some(called) = unless_stopped(&mut stopped, call).await else {
        turn.finally(GUARD_GRACE, || drop(store)).await;
        return Finished::failed(gone(), started);
    };
    let data = store.data_mut();
    let witness = Witness {
        store_fault: data.objects.store_fault.take(),
        last_object_failure: data.objects.last_failure.take(),
    };
    let (read_time, queue_time) = (data.objects.read_time, data.nn.queue_time);
    let outcome = match called {
        Err(expired) => Err(InvokeError::Stopped(Stop::Time {
            limit: expired.limit,
            during: "in a host call",
        })),
        // A guest that trapped on a store failure (it unwrapped the error) gets the host's
        // answer for the store.
        Ok(Err(trap)) => Err(
            match (classify_trap(trap, limits.timeout), witness.store_fault) {
                (InvokeError::Trapped(_), Some(fault)) => InvokeError::Store(fault),
                (other, _) => other,
            },
        ),
        Ok(Ok(Err(guest))) => Err(guest_error(guest, witness)),
        // A wasi-nn tensor is taken out of the store's handles, with its charge, before they go.
        Ok(Ok(Ok(out))) => take_output(&mut data.table, out),
    };
    // The guest's memory, and all the host held for it, goes before its output is encoded:
    // only the output (lifted out of that memory, or the tensor it handed over) is held from
    // here. Freed on a slot of the tenant's share, which a call stopped at its deadline in a
    // host call's wait does not hold.
    turn.finally(GUARD_GRACE, || drop(store)).await;
    let result = match outcome {
        Err(e) => Err(e),
        Ok(Returned { out, charge }) => {
            // Bytes lifted out of the guest's memory fit: that memory held them. A wasi-nn
            // tensor's bytes stay on the charge they were made under.
            let held = match charge {
                Some(charge) => Ok(charge),
                None => account.charge(out.data.len() as u64, "output"),
            };
            match held {
                Ok(_held) => {
                    let mut encoding = Box::pin(encode(
                        out,
                        limits.max_output,
                        &reply,
                        &account,
                        &deadline,
                        &turn,
                    ));
                    match unless_stopped(&mut stopped, &mut encoding).await {
                        Some(encoded) => encoded,
                        // The output (up to the memory limit), and what encoding it holds,
                        // freed on a slot too: the encoding may have been waiting for one.
                        None => {
                            turn.finally(GUARD_GRACE, move || drop(encoding)).await;
                            Err(gone())
                        }
                    }
                }
                Err(e) => Err(InvokeError::Stopped(Stop::from(e))),
            }
        }
    };
    let timings = Timings {
        instantiate: instantiated,
        read: read_time,
        queue: queue_time,
        compute: usage.compute(),
        total: started.elapsed(),
    };
    let read = usage.read_bytes();
    Finished {
        result,
        timings,
        read,
        memory_peak: account.peak(),
    }
}

/// A function's output, out of its store.
struct Returned {
    out: TensorOut,
    /// What covers a wasi-nn tensor's bytes (and its handle and dimensions), held until the
    /// response is encoded; `None` for bytes lifted out of the guest's memory.
    charge: Option<Charge>,
}

/// `run`'s output as the host holds it: the bytes lifted out of the guest's memory, or the
/// wasi-nn tensor behind the handle it returned, taken out of `table` without a copy.
fn take_output(table: &mut ResourceTable, out: GuestOutput) -> Result<Returned, InvokeError> {
    let handle = match out {
        GuestOutput::Bytes(out) => return Ok(Returned { out, charge: None }),
        GuestOutput::Nn(handle) => handle,
    };
    let tensor = table
        .delete(handle)
        .map_err(|e| InvokeError::HostFault(format!("the output tensor's handle: {e}")))?;
    let ty = match tensor.ty {
        ElemType::Fp32 => ElementType::F32,
        ElemType::Fp16 => ElementType::F16,
        ElemType::Bf16 => ElementType::Bf16,
        ElemType::U8 => ElementType::U8,
        ElemType::I64 => ElementType::I64,
        other @ (ElemType::Fp64 | ElemType::I32) => {
            return Err(InvokeError::BadOutput(format!(
                "a wasi-nn tensor of type {}; an output is fp32, fp16, bf16, u8 or i64",
                other.name()
            )));
        }
    };
    Ok(Returned {
        out: TensorOut {
            dimensions: tensor.dimensions,
            ty,
            data: tensor.data,
        },
        charge: Some(tensor.charge),
    })
}

/// The end of an invocation's request: its sender, held by the request's future, is dropped
/// with it (never used).
type Stopped = tokio::sync::oneshot::Receiver<()>;

/// `f`'s output, or `None` once the invocation's request has gone away (looked at first).
async fn unless_stopped<F: Future>(stopped: &mut Stopped, f: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = stopped => None,
        out = f => Some(out),
    }
}

/// How an invocation's output is sent.
#[derive(Debug, Default, Clone)]
pub struct Reply {
    /// The safetensors header's metadata.
    pub meta: BTreeMap<String, String>,
    /// The caller asked for int8 features (an f32 output quantized by the host).
    pub quantize: Option<Quantize>,
}

/// Reads of the output's values (each is read twice) between two looks at the deadline: a
/// millisecond or two of work.
const QUANTIZE_SLICE: u64 = 1 << 20;

/// The guest's output as a safetensors response, checked: its shape against its data, its
/// rank, and the encoded size against the tenant's output limit. Quantized on request: the
/// int8 copy is charged to `account` beside the output (the caller charges that), and the work
/// counts against the invocation's `deadline`.
async fn encode(
    out: TensorOut,
    limit: u64,
    reply: &Reply,
    account: &Arc<Account>,
    deadline: &Deadline,
    turn: &Turn,
) -> Result<Output, InvokeError> {
    let meta = &reply.meta;
    // Before its dimensions are widened or looked at (a guest may return millions of them).
    let rank = out.dimensions.len();
    if rank == 0 || rank > hapi_wire::tensor::MAX_RANK {
        return Err(InvokeError::BadOutput(format!(
            "a tensor of rank {rank}; 1..={} dimensions are allowed",
            hapi_wire::tensor::MAX_RANK
        )));
    }
    if let Some(Quantize::Int8) = reply.quantize {
        if out.ty != ElementType::F32 {
            return Err(InvokeError::Guest {
                code: hapi_wire::ErrorCode::BadRequest,
                message: format!(
                    "quantize `int8` applies to f32 outputs, and the function returned {:?}; \
                     ask it for f32 (feature-extract: no `dtype` option)",
                    out.ty
                ),
                key: None,
            });
        }
        let shape: Vec<u64> = out.dimensions.iter().map(|&d| u64::from(d)).collect();
        // A rank-1 output: valid, but not one int8 can cut; the caller asked for it.
        hapi_wire::quantize::groups(&shape).map_err(|e| InvokeError::Guest {
            code: hapi_wire::ErrorCode::BadRequest,
            message: crate::account::text::bounded(format!("quantize `int8`: {e}")),
            key: None,
        })?;
        // Checked against the data and the output limit before anything is allocated.
        let plan = Plan::new(&shape, out.data.len() as u64, meta)
            .map_err(|e| InvokeError::BadOutput(crate::account::text::bounded(e)))?;
        let size = (plan.header().len() + plan.data_len()) as u64;
        if size > limit {
            return Err(InvokeError::OutputTooLarge { size, limit });
        }
        let _held = account
            .charge(plan.data_len() as u64, "int8 output")
            .map_err(|e| InvokeError::Stopped(Stop::from(e)))?;
        // In slices, like the guest's own time: the deadline is looked at, and the worker
        // handed to the other invocations (and the run slot to the other tenants) between them.
        let mut data = vec![0u8; plan.data_len()];
        let mut at = Cursor::default();
        while !plan
            .fill(&out.data, &mut data, &mut at, QUANTIZE_SLICE)
            .map_err(|e| InvokeError::BadOutput(crate::account::text::bounded(e)))?
        {
            if deadline.expired() {
                return Err(InvokeError::Stopped(Stop::Time {
                    limit: deadline.limit(),
                    during: "while quantizing the output",
                }));
            }
            turn.tick().await;
        }
        return Ok(Output {
            header: plan.into_header(),
            data,
        });
    }
    let dtype = match out.ty {
        ElementType::F32 => Dtype::F32,
        ElementType::U8 => Dtype::U8,
        ElementType::I64 => Dtype::I64,
        ElementType::F16 => Dtype::F16,
        ElementType::Bf16 => Dtype::BF16,
    };
    let shape: Vec<u64> = out.dimensions.iter().map(|&d| u64::from(d)).collect();
    let header = hapi_wire::tensor::header(dtype, &shape, out.data.len() as u64, meta)
        .map_err(|e| InvokeError::BadOutput(crate::account::text::bounded(e)))?;
    let size = (header.len() + out.data.len()) as u64;
    if size > limit {
        return Err(InvokeError::OutputTooLarge { size, limit });
    }
    Ok(Output {
        header,
        data: out.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Poll;

    /// An f32 output of 16 x 64 x 32 x 32 values (4 MiB), two slices' work to quantize.
    fn output() -> TensorOut {
        let data = (0..16 * 64 * 32 * 32u32)
            .flat_map(|i| ((i % 251) as f32 - 125.0).to_le_bytes())
            .collect();
        TensorOut {
            dimensions: vec![16, 64, 32, 32],
            ty: ElementType::F32,
            data,
        }
    }

    /// A run slot of a worker of its own.
    fn turn() -> Arc<Turn> {
        Turn::new(
            &CpuShares::new(1),
            "t",
            1,
            Instant::now() + Duration::from_secs(60),
        )
    }

    fn int8() -> Reply {
        Reply {
            meta: BTreeMap::new(),
            quantize: Some(Quantize::Int8),
        }
    }

    /// Polls `f` to its end on this task, counting the times it gave the worker back.
    async fn polled<F: Future>(f: F) -> (F::Output, usize) {
        let mut f = pin!(f);
        let mut yields = 0;
        let out = std::future::poll_fn(|cx| match f.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => {
                yields += 1;
                Poll::Pending
            }
        })
        .await;
        (out, yields)
    }

    /// A guest's stdout and stderr grant 4 KiB a write and take no more, whatever length a
    /// `write-zeroes` asks for: with wasmtime's own sink (64 KiB in 48.0.8, `usize::MAX` on
    /// its main branch) a larger one allocated that many zeroes in the host, uncharged.
    #[tokio::test]
    async fn a_guests_stdout_and_stderr_take_a_bounded_write_whatever_it_asks() {
        use wasmtime::component::Resource;
        use wasmtime_wasi::cli::WasiCliCtxView;
        use wasmtime_wasi::p2::bindings::cli::{stderr, stdout};
        use wasmtime_wasi::p2::bindings::io::streams::HostOutputStream;
        let mut ctx = wasi_ctx(Some(0));
        let mut table = ResourceTable::new();
        for which in ["stdout", "stderr"] {
            let mut view = WasiCliCtxView {
                ctx: ctx.cli(),
                table: &mut table,
            };
            let stream = if which == "stdout" {
                stdout::Host::get_stdout(&mut view)
            } else {
                stderr::Host::get_stderr(&mut view)
            }
            .expect("a stream");
            let at = || Resource::new_borrow(stream.rep());
            let permit = HostOutputStream::check_write(&mut table, at()).expect("check-write");
            assert_eq!(permit, DISCARD_PERMIT as u64, "{which}'s check-write");
            HostOutputStream::write_zeroes(&mut table, at(), permit).expect("within the permit");
            HostOutputStream::write(&mut table, at(), vec![1; DISCARD_PERMIT]).expect("a write");
            HostOutputStream::blocking_write_zeroes_and_flush(&mut table, at(), permit)
                .await
                .expect("a blocking write");
            for len in [permit + 1, 1 << 48, u64::MAX] {
                let e = HostOutputStream::write_zeroes(&mut table, at(), len)
                    .expect_err("past the permit");
                assert!(
                    format!("{e:?}").contains("past the 4096 that check-write allows"),
                    "{which}, {len}: {e:?}"
                );
            }
            let e = HostOutputStream::write(&mut table, at(), vec![0; DISCARD_PERMIT + 1])
                .expect_err("a write past the permit");
            assert!(format!("{e:?}").contains("4097 bytes"), "{which}: {e:?}");
        }
    }

    #[tokio::test]
    async fn quantizing_yields_between_slices_and_gives_the_wire_crates_bytes() {
        let out = output();
        let shape: Vec<u64> = out.dimensions.iter().map(|&d| u64::from(d)).collect();
        let (header, data) =
            hapi_wire::quantize::quantize(&shape, &out.data, &BTreeMap::new()).expect("quantized");
        let account = Account::new(64 << 20);
        let deadline = Deadline::new(Duration::from_secs(60));
        let (got, yields) =
            polled(encode(out, 64 << 20, &int8(), &account, &deadline, &turn())).await;
        let got = got.expect("encoded");
        assert_eq!((got.header, got.data), (header, data));
        assert!(yields >= 1, "{yields} yields for 2 Mi reads, 1 Mi a slice");
        assert_eq!(
            account.used(),
            0,
            "the int8 copy's charge ends with the call"
        );
    }

    #[tokio::test]
    async fn quantizing_past_the_deadline_stops_the_invocation() {
        let account = Account::new(64 << 20);
        let deadline = Deadline::new(Duration::ZERO);
        let e = encode(output(), 64 << 20, &int8(), &account, &deadline, &turn())
            .await
            .expect_err("past its deadline");
        assert!(
            matches!(
                e,
                InvokeError::Stopped(Stop::Time {
                    during: "while quantizing the output",
                    ..
                })
            ),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn an_output_of_no_or_too_many_dimensions_is_the_functions_fault() {
        let account = Account::new(64 << 20);
        let deadline = Deadline::new(Duration::from_secs(60));
        for (rank, reply) in [
            (0, Reply::default()),
            (9, Reply::default()),
            (0, int8()),
            (9, int8()),
            (1 << 20, int8()),
        ] {
            let out = TensorOut {
                dimensions: vec![1; rank],
                ty: ElementType::F32,
                data: vec![0; 4],
            };
            let e = encode(out, 64 << 20, &reply, &account, &deadline, &turn())
                .await
                .expect_err("refused");
            assert!(
                matches!(&e, InvokeError::BadOutput(m) if m.contains(&format!("rank {rank};"))),
                "rank {rank}: {e:?}"
            );
        }
        // Rank 1 is an output, just not one int8 can cut: the caller's request is refused.
        let out = TensorOut {
            dimensions: vec![1],
            ty: ElementType::F32,
            data: vec![0; 4],
        };
        let e = encode(out, 64 << 20, &int8(), &account, &deadline, &turn())
            .await
            .expect_err("refused");
        assert!(
            matches!(
                e,
                InvokeError::Guest {
                    code: hapi_wire::ErrorCode::BadRequest,
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
