//! `hapi-host`: the storage tier of HAPI.
//!
//! A multi-tenant wasmtime host. Each tenant deploys pushdown functions (Wasm components of the
//! `hapi:pushdown/pushdown` world); each invocation runs in a fresh store with the tenant's
//! memory, time and output limits, reads only the tenant's granted objects, and calls model
//! segments through wasi-nn on libtorch (CUDA when present).

pub mod api;
pub mod metrics;
pub mod models;
pub mod nn;
pub mod objects;
pub mod policy;
pub mod runtime;
pub mod units;

use crate::metrics::Metrics;
use crate::models::Models;
use crate::policy::{Policy, Tenant};
use crate::runtime::{DeployError, Function, FunctionTable, Runtime};
use anyhow::Context;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use tokio::sync::Semaphore;

/// The running host: policy, compiled functions and shared runtime.
#[derive(Debug)]
pub struct Host {
    policy: RwLock<Arc<Policy>>,
    runtime: Runtime,
    functions: RwLock<FunctionTable>,
    permits: Mutex<HashMap<String, Arc<Semaphore>>>,
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
        let runtime = Runtime::new(Arc::new(models), Arc::new(store), Arc::new(nn::Direct))?;
        std::fs::create_dir_all(h.state.join("functions"))
            .with_context(|| format!("creating {}", h.state.display()))?;
        let host = Arc::new(Self {
            state: h.state.clone(),
            policy: RwLock::new(Arc::new(policy.clone())),
            runtime,
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
    /// they started with. Host settings (listen address, store, models) need a restart.
    pub fn reload(&self, policy: Policy) -> anyhow::Result<()> {
        let old = self.policy();
        if old.host.store != policy.host.store
            || old.host.models != policy.host.models
            || old.host.listen != policy.host.listen
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

    /// The tenant's concurrency semaphore.
    pub fn permits(&self, tenant: &Tenant) -> Arc<Semaphore> {
        let mut map = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            map.entry(tenant.name.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(tenant.limits.concurrency))),
        )
    }
}
