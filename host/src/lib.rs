//! `hapi-host`: the storage tier of HAPI.
//!
//! A multi-tenant wasmtime host. Each tenant deploys pushdown functions (Wasm components of the
//! `hapi:pushdown/pushdown` world); each invocation runs in a fresh store with the tenant's
//! memory, time and output limits, reads only the tenant's granted objects, and calls model
//! segments through wasi-nn on libtorch (CUDA when present).

pub mod api;
pub mod device;
pub mod memory;
pub mod metrics;
pub mod models;
pub mod nn;
pub mod objects;
pub mod policy;
pub mod runtime;
pub mod units;

use crate::device::{Device, DeviceConfig};
use crate::metrics::Metrics;
use crate::models::Models;
use crate::policy::{Policy, Tenant};
use crate::runtime::{DeployError, Function, FunctionTable, Runtime};
use anyhow::Context;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use tokio::sync::Semaphore;

/// The running host: policy, compiled functions and shared runtime.
#[derive(Debug)]
pub struct Host {
    policy: RwLock<Arc<Policy>>,
    runtime: Runtime,
    device: Arc<Device>,
    functions: RwLock<FunctionTable>,
    permits: Mutex<HashMap<String, Arc<Admission>>>,
    pub metrics: Metrics,
    state: PathBuf,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl Host {
    /// Opens the store and the models, starts the engine, and deploys the functions the policy
    /// names and those tenants deployed earlier (kept under the state directory).
    pub fn start(policy: Policy) -> anyhow::Result<Arc<Self>> {
        let h = &policy.host;
        let device = hapi_model::device::parse(&h.device)?;
        let models = Models::open(&h.models, device)
            .with_context(|| format!("reading model packages in {}", h.models.display()))?;
        let store = objects::Store::open(&h.store)
            .with_context(|| format!("opening the object store {:?}", h.store))?;
        let models = Arc::new(models);
        let device = Device::start(
            DeviceConfig {
                budget: h.memory_budget,
                adapt: h.adapt_batch,
                pool: h.pool,
                window: h.batch_window,
                max_batch: h.max_batch,
            },
            Arc::clone(&models),
        )?;
        let runtime = Runtime::new(models, Arc::new(store), Arc::clone(&device) as _)?;
        std::fs::create_dir_all(h.state.join("functions"))
            .with_context(|| format!("creating {}", h.state.display()))?;
        let host = Arc::new(Self {
            state: h.state.clone(),
            policy: RwLock::new(Arc::new(policy.clone())),
            runtime,
            device,
            functions: RwLock::default(),
            permits: Mutex::default(),
            metrics: Metrics::default(),
        });
        host.deploy_from_policy_and_state(&policy)?;
        Ok(host)
    }

    fn deploy_from_policy_and_state(&self, policy: &Policy) -> anyhow::Result<()> {
        let mut table = FunctionTable::new();
        for tenant in policy.tenants.values() {
            let mut fns = std::collections::BTreeMap::new();
            // Functions the tenant deployed through the API, then those the policy names.
            let dir = self.state.join("functions").join(&tenant.name);
            if dir.is_dir() {
                for entry in std::fs::read_dir(&dir)? {
                    let path = entry?.path();
                    let Some(name) = path
                        .file_stem()
                        .and_then(|n| n.to_str())
                        .map(str::to_string)
                    else {
                        continue;
                    };
                    if path.extension().is_some_and(|e| e == "wasm") {
                        let bytes = std::fs::read(&path)?;
                        match self
                            .runtime
                            .compile(tenant, &name, &bytes, Some(&self.cache_dir()))
                        {
                            Ok(f) => {
                                fns.insert(name, f);
                            }
                            Err(e) => tracing::warn!("not loading {}: {e}", path.display()),
                        }
                    }
                }
            }
            for (name, path) in &tenant.functions {
                let bytes = std::fs::read(path).with_context(|| {
                    format!(
                        "tenant `{}` function `{name}`: reading {}",
                        tenant.name,
                        path.display()
                    )
                })?;
                let f = self
                    .runtime
                    .compile(tenant, name, &bytes, Some(&self.cache_dir()))
                    .with_context(|| {
                        format!(
                            "tenant `{}` function `{name}` ({})",
                            tenant.name,
                            path.display()
                        )
                    })?;
                fns.insert(name.clone(), f);
            }
            table.insert(tenant.name.clone(), fns);
        }
        *write(&self.functions) = table;
        Ok(())
    }

    /// Compiled machine code of deployed components, reused across restarts.
    fn cache_dir(&self) -> PathBuf {
        self.state.join("compiled")
    }

    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&read(&self.policy))
    }

    /// Replaces the policy (SIGHUP). In-flight invocations finish under the tenant settings
    /// they started with. Host settings (listen address, store, models, device and its budget,
    /// batching) need a restart.
    pub fn reload(&self, policy: Policy) -> anyhow::Result<()> {
        let old = self.policy();
        let (a, b) = (&old.host, &policy.host);
        if a.store != b.store
            || a.models != b.models
            || a.listen != b.listen
            || a.device != b.device
            || a.memory_budget != b.memory_budget
            || a.adapt_batch != b.adapt_batch
            || a.pool != b.pool
            || a.batch_window != b.batch_window
            || a.max_batch != b.max_batch
        {
            tracing::warn!(
                "host settings changed in the policy; they take effect at the next restart"
            );
        }
        self.deploy_from_policy_and_state(&policy)?;
        self.permits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        *write(&self.policy) = Arc::new(policy);
        Ok(())
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn function(&self, tenant: &str, name: &str) -> Option<Function> {
        read(&self.functions).get(tenant)?.get(name).cloned()
    }

    pub fn functions(&self, tenant: &str) -> Vec<Function> {
        read(&self.functions)
            .get(tenant)
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Compiles and stores a tenant's component; replaces a function of the same name.
    pub fn deploy(
        &self,
        tenant: &Tenant,
        name: &str,
        bytes: &[u8],
    ) -> Result<Function, DeployError> {
        let f = self
            .runtime
            .compile(tenant, name, bytes, Some(&self.cache_dir()))?;
        let dir = self.state.join("functions").join(&tenant.name);
        let saved = std::fs::create_dir_all(&dir).and_then(|()| {
            let tmp = dir.join(format!(".{name}.wasm.tmp"));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, dir.join(format!("{name}.wasm")))
        });
        if let Err(e) = saved {
            tracing::error!("saving function `{name}` of `{}`: {e}", tenant.name);
        }
        write(&self.functions)
            .entry(tenant.name.clone())
            .or_default()
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Removes a tenant's function; false if there was none.
    pub fn undeploy(&self, tenant: &Tenant, name: &str) -> bool {
        let removed = write(&self.functions)
            .get_mut(&tenant.name)
            .and_then(|f| f.remove(name))
            .is_some();
        let _ = std::fs::remove_file(
            self.state
                .join("functions")
                .join(&tenant.name)
                .join(format!("{name}.wasm")),
        );
        removed
    }

    /// The device that runs model segments.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The tenant's admission: its concurrency slots and how many wait for one.
    pub fn permits(&self, tenant: &Tenant) -> Arc<Admission> {
        let mut map = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(tenant.name.clone()).or_insert_with(|| {
            Arc::new(Admission {
                slots: Arc::new(Semaphore::new(tenant.limits.concurrency)),
                waiting: AtomicUsize::new(0),
                queue: tenant.limits.queue,
            })
        }))
    }
}

/// A tenant's admission control: `concurrency` invocations run, up to `queue` more wait for a
/// slot (in arrival order), and past that the host answers 429 at once.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    queue: usize,
}

impl Admission {
    /// A running slot, after waiting for one if the queue has room; `None` when it has not.
    pub async fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(p) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(p);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // Decremented whether the wait ends or the request is dropped.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _w = Waiting(&self.waiting);
        Arc::clone(&self.slots).acquire_owned().await.ok()
    }

    /// Invocations waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}
