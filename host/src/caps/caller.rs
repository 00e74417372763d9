//! Who a host call is made for: the tenant, its invocation's memory account, deadline, usage and
//! run slot.

use crate::account::{Account, Deadline, Usage};
use crate::policy::{Current, Tenant};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant as it was admitted: its limits bind the whole invocation.
    pub tenant: Arc<Tenant>,
    /// The policy in force, for [`Caller::tenant_now`].
    pub policy: Arc<Current>,
    pub account: Arc<Account>,
    pub deadline: Arc<Deadline>,
    pub usage: Arc<Usage>,
    /// The invocation's run slot on the workers: given back while a host call waits.
    pub turn: Arc<crate::wasm::cpu::Turn>,
    /// The tenant's admission slot the invocation runs in, if it was admitted (an HTTP
    /// invocation): its device calls hold it too (see [`crate::device::job::Job::slot`]).
    pub slot: Option<Arc<crate::admission::Permit>>,
}

impl Caller {
    /// The tenant as the policy in force has it: what a host call that uses a grant (an
    /// object, a model) checks against, so that a reload which takes a grant away, removes
    /// the tenant or changes its token reaches a running invocation at its next such call, not
    /// when it ends (up to the policy's longest time limit later). A tenant removed, or whose
    /// token changed, stops the invocation ([`Stop::Revoked`]).
    pub fn tenant_now(&self) -> Result<Arc<Tenant>, Stop> {
        self.tenant
            .as_in(&self.policy.get().tenants)
            .cloned()
            .ok_or_else(|| {
                Stop::Revoked(format!(
                    "a policy reload removed tenant `{}` or changed its token while its invocation ran",
                    self.tenant.name
                ))
            })
    }
}

/// Why a host call stops the guest (a trap): the host's limits and the host's own answers, not
/// the guest's errors. A guest cannot carry on past any of them: the host answers the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// The device refused the call (no room now, never fits, shutting down) or failed; the
    /// host answers with that.
    #[error("{0}")]
    Device(crate::device::DeviceError),
    /// Guest memory plus what the host holds went over the memory limit.
    #[error("{0}")]
    Memory(String),
    /// The guest's handle table went over its limit.
    #[error("{0}")]
    Table(String),
    /// A reload removed the tenant or changed its token while the invocation ran.
    #[error("{0}")]
    Revoked(String),
    /// The deadline passed inside a host call.
    #[error("time limit of {limit:?} exceeded {during}")]
    Time {
        limit: std::time::Duration,
        during: &'static str,
    },
}

impl From<crate::account::OverLimit> for Stop {
    fn from(e: crate::account::OverLimit) -> Self {
        Stop::Memory(e.to_string())
    }
}

impl Stop {
    pub fn trap(self) -> wasmtime::Error {
        wasmtime::Error::new(self)
    }
}
