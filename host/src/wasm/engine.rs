//! The engine all tenants share, and the epoch clock that drives deadlines.

use std::time::{Duration, Instant};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ProfilingStrategy,
    WasmBacktraceDetails,
};

/// Epoch tick: how often a running guest is checked against its deadline and yields to other
/// invocations on the same worker thread.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Instances alive at once across all tenants (pooling allocator slots), at least: the pool
/// holds the sum of the tenants' `concurrency` when that is more ([`instances_for`]).
pub const MIN_INSTANCES: u32 = 256;

/// The pool's instances for tenants whose `concurrency` adds up to `invocations`: each
/// invocation holds one, so that no tenant within its concurrency is refused (429 `busy`)
/// for slots other tenants hold. At most `policy::MAX_INVOCATIONS`, which a policy may not
/// pass (each instance reserves address space for its memories: 4 GiB and a guard each).
pub fn instances_for(invocations: usize) -> u32 {
    let most = u32::try_from(crate::policy::MAX_INVOCATIONS).unwrap_or(u32::MAX);
    u32::try_from(invocations)
        .unwrap_or(u32::MAX)
        .clamp(MIN_INSTANCES, most)
}
/// Core instances one component instance may create, its nested components' included (a
/// pushdown function from `cargo component` or `wasm32-wasip2` creates three: its module, and
/// the shim and fix-up modules `wit-component` adds). Checked when the component is compiled.
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 16;
/// Linear memories one component instance may define (ours define one; two leave room for a
/// second module's, a guest written in two languages, say: nested components, a composition,
/// are refused by the upload check).
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 2;
/// Tables one component instance may define (ours define two: the module's and the shim's).
pub const MAX_TABLES_PER_COMPONENT: u32 = 4;
/// Largest table a guest may grow to (entries), the pool's bound as well as the limiter's
/// (`limits.rs`): the pool's default (20,000) had been below the limiter's 100,000, so a growth
/// between the two answered -1 to the guest.
pub const MAX_TABLE_ELEMENTS: usize = 20_000;
/// Stack of a guest's call into the host (async fiber): what Rust guests and the host's
/// bindings need, with room to spare.
pub const STACK_BYTES: usize = 2 << 20;

/// Environment variable that makes the engine write `/tmp/perf-<pid>.map` (value `perfmap`),
/// so that `perf record` / `perf report` name the guests' compiled functions.
pub const PROFILER_ENV: &str = "HAPI_WASM_PROFILER";

/// Builds the engine: component model, async host calls, epoch interruption and a pooling
/// allocator of `instances` component instances, with `max_memory` bytes per guest memory, of
/// which `keep_resident` stay resident (zeroed with memset) when an instance ends, so that the
/// next instance in the slot does not page-fault them in. Slots are reused most recently used
/// first, so at most (instances alive at once) x `keep_resident` stays resident.
pub fn engine(max_memory: u64, keep_resident: u64, instances: u32) -> anyhow::Result<Engine> {
    let mut config = Config::new();
    match std::env::var(PROFILER_ENV).as_deref() {
        Err(_) | Ok("" | "none") => {}
        Ok("perfmap") => {
            config.profiler(ProfilingStrategy::PerfMap);
        }
        Ok(other) => anyhow::bail!("{PROFILER_ENV}={other}: expected `perfmap` or `none`"),
    }
    config.wasm_component_model(true);
    // One thread per compile: a tenant's compile time is charged as wall time on one compile
    // thread (`compile_share`), which it would undercount by the number of cores if cranelift
    // spread one upload's functions over all of them, the invocation workers' too.
    config.parallel_compilation(false);
    config.async_stack_size(STACK_BYTES);
    config.epoch_interruption(true);
    // A memory's initial image is built when a module is compiled (for copy-on-write
    // instantiation) if it is dense, or smaller than this: with wasmtime's 16 MiB, one data
    // byte at each end of a memory made a 16 MiB image of a few bytes of upload, per memory,
    // charged to no one. Now at most 1 MiB, or twice the data bytes, which the upload carries.
    config.memory_guaranteed_dense_image_size(1 << 20);
    // Traps' backtraces name each frame's module and function (bounded at upload, see
    // `compile::MAX_FUNCTION_NAME`); never the DWARF file names and paths a guest may carry,
    // whatever `WASMTIME_BACKTRACE_DETAILS` says.
    config.wasm_backtrace_details(WasmBacktraceDetails::Disable);
    // The pool's totals are the instances' times what one may hold, so that a component full of
    // core instances, memories or tables cannot take the slots of other tenants' instances: the
    // instance count binds first (an upload past the per-component maxima is refused when it
    // is compiled, "The component transitively contains ...").
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .total_core_instances(instances * MAX_CORE_INSTANCES_PER_COMPONENT)
        .total_memories(instances * MAX_MEMORIES_PER_COMPONENT)
        .total_tables(instances * MAX_TABLES_PER_COMPONENT)
        .total_stacks(instances)
        .table_elements(MAX_TABLE_ELEMENTS)
        .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX))
        .linear_memory_keep_resident(usize::try_from(keep_resident).unwrap_or(usize::MAX))
        .max_unused_warm_slots(0);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let engine = Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    spawn_ticker(&engine)?;
    Ok(engine)
}

/// The epoch clock: deadlines are checked every [`EPOCH_TICK`] of wall time. When the ticker
/// oversleeps (a loaded machine), it catches up, so checks are not delayed further. It stops
/// when the engine is dropped.
fn spawn_ticker(engine: &Engine) -> std::io::Result<()> {
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
    Ok(())
}
