//! The `objects` capability: a tenant's read access to its granted buckets and prefixes
//! (`hapi:pushdown/objects`), through [`Scoped`], which checks keys, grants and byte caps.
//!
//! What a call returns is on its way into the guest's memory; it must fit beside what the
//! invocation already holds, and is refused (a memory-limit trap) before the host reads it
//! otherwise. The context remembers what failed (for the host's answer: the key an error is
//! about, and whether the store itself failed).

use crate::account::Pace;
use crate::account::text::quote;
use crate::bindings::hapi::pushdown::objects as wit;
use crate::caps::caller::{Caller, Stop};
use crate::store::scoped::Scoped;
use crate::store::{ObjectError, ObjectMeta, Store};
use crate::wasm::cpu::Turn;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{HasData, Linker};

/// How an object call failed, for the host's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    NotFound,
    Denied,
    TooLarge,
    /// A listing past its bound on entries visited (the guest sees `too-large`, carrying it).
    TooManyEntries,
    Io,
}

/// The capability's state in one invocation's store.
#[derive(Debug)]
pub struct ObjectsCtx {
    caller: Caller,
    scoped: Scoped,
    /// Time spent in object calls.
    pub read_time: Duration,
    /// The store's own failure, if one happened (the host answers for it).
    pub store_fault: Option<String>,
    /// The last failed call: how, and on which key.
    pub last_failure: Option<(Failure, String)>,
}

/// `add_to_linker`'s marker: the capability's data is the context itself.
#[derive(Debug)]
pub struct Objects;

impl HasData for Objects {
    type Data<'a> = &'a mut ObjectsCtx;
}

/// Adds `hapi:pushdown/objects` to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut ObjectsCtx,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, Objects>(linker, get)
}

/// The guest's error for a store failure on `key`. A store's own failure (`Io`) carries what
/// the store said (an S3 client's error names the endpoint, the request and the server's
/// answer; a file system's, the host's error): that is the operator's, logged, and the guest
/// gets only that the store failed on its key.
fn to_wit(key: &str, e: ObjectError) -> wit::ObjectError {
    match e {
        ObjectError::NotFound(m) => wit::ObjectError::NotFound(m),
        ObjectError::Denied(m) => wit::ObjectError::Denied(m),
        ObjectError::TooLarge(n) | ObjectError::TooManyEntries(n) => wit::ObjectError::TooLarge(n),
        ObjectError::Io(_) | ObjectError::Stopped(_) => wit::ObjectError::Io(format!(
            "the object store failed on `{}`; retry later",
            quote(key)
        )),
        // Never the guest's to see (the invocation stops at its memory limit).
        ObjectError::OverLimit(e) => wit::ObjectError::TooLarge(e.limit),
    }
}

fn meta(m: ObjectMeta) -> wit::ObjectMeta {
    wit::ObjectMeta {
        key: m.key,
        size: m.size,
        last_modified_ms: m.last_modified_ms,
        etag: m.etag,
    }
}

type Answer<T> = wasmtime::Result<Result<T, wit::ObjectError>>;

impl ObjectsCtx {
    pub fn new(caller: Caller, store: Arc<Store>) -> Self {
        Self {
            scoped: Scoped::new(Arc::clone(&caller.tenant), store)
                .paced(Arc::clone(&caller.turn) as Arc<dyn Pace>)
                .charged_to(Arc::clone(&caller.account)),
            caller,
            read_time: Duration::ZERO,
            store_fault: None,
            last_failure: None,
        }
    }

    /// Runs a store call on the invocation's turn: the local store's work (on a blocking
    /// thread, paced by the turn) holds the tenant's slot as guest code does, and stops at the
    /// deadline itself; a remote store's waits give it back, and it is not polled past the
    /// deadline (`None`).
    async fn on_turn<F: Future>(here: bool, turn: &Turn, call: F) -> Option<F::Output> {
        if here {
            Some(turn.hold(call).await)
        } else {
            turn.off_within(call).await
        }
    }

    /// The invocation's stop at its time limit, inside an object store call.
    fn out_of_time(&self) -> wasmtime::Error {
        Stop::Time {
            limit: self.caller.deadline.limit(),
            during: "in an object store call",
        }
        .trap()
    }

    /// Checks the next call against the grants of the tenant as the policy in force has it: a
    /// reload reaches a running invocation here.
    fn regrant(&mut self) -> wasmtime::Result<()> {
        let now = self.caller.tenant_now().map_err(Stop::trap)?;
        self.scoped.regrant(now);
        Ok(())
    }

    /// Records a failure on `key` and turns it into the guest's error; past the invocation's
    /// deadline (the local store's job stops there, `Stopped`), any failure stops the
    /// invocation at its time limit instead, a store's own failure recorded first.
    fn failed<T>(&mut self, key: &str, e: ObjectError) -> Answer<T> {
        let kind = match &e {
            ObjectError::NotFound(_) => Failure::NotFound,
            ObjectError::Denied(_) => Failure::Denied,
            ObjectError::TooLarge(_) => Failure::TooLarge,
            ObjectError::TooManyEntries(_) => Failure::TooManyEntries,
            ObjectError::Stopped(_) => return Err(self.out_of_time()),
            ObjectError::OverLimit(over) => return Err(Stop::from(over.clone()).trap()),
            ObjectError::Io(m) => {
                tracing::warn!(
                    "tenant `{}`: object store error on `{}`: {m}",
                    self.caller.tenant.name,
                    quote(key)
                );
                self.store_fault.get_or_insert_with(|| m.clone());
                Failure::Io
            }
        };
        if self.caller.deadline.expired() {
            return Err(self.out_of_time());
        }
        self.last_failure = Some((kind, quote(key)));
        Ok(Err(to_wit(key, e)))
    }

    /// Reads a whole object (`range` None) or a byte range.
    async fn read(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Answer<Vec<u8>> {
        self.regrant()?;
        let started = Instant::now();
        let turn = Arc::clone(&self.caller.turn);
        // Planning and reading are one call on the turn.
        let here = self.scoped.works_here();
        let read = Self::on_turn(here, &turn, async {
            let planned = self
                .scoped
                .plan(bucket, key, range)
                .await
                .map_err(Step::Failed)?;
            self.caller.usage.set_read_bytes(self.scoped.bytes_read);
            self.caller
                .account
                .check_incoming(planned.length, "object read")
                .map_err(Step::Over)?;
            self.scoped.read(&planned).await.map_err(Step::Failed)
        })
        .await;
        self.read_time += started.elapsed();
        let read = read.ok_or_else(|| self.out_of_time())?;
        match read {
            Ok(b) => Ok(Ok(b)),
            Err(Step::Failed(e)) => self.failed(key, e),
            Err(Step::Over(e)) => Err(Stop::from(e).trap()),
        }
    }
}

/// Why a read stopped: the store's answer (the guest's to handle), or the memory limit (a trap).
enum Step {
    Failed(ObjectError),
    Over(crate::account::OverLimit),
}

/// `hapi:pushdown/types` has types only; its (empty) interface is linked with the objects.
impl crate::bindings::hapi::pushdown::types::Host for ObjectsCtx {}

impl wit::Host for ObjectsCtx {
    async fn get(&mut self, bucket: String, key: String) -> Answer<Vec<u8>> {
        self.read(&bucket, &key, None).await
    }

    async fn get_range(
        &mut self,
        bucket: String,
        key: String,
        offset: u64,
        length: u64,
    ) -> Answer<Vec<u8>> {
        self.read(&bucket, &key, Some((offset, length))).await
    }

    async fn head(&mut self, bucket: String, key: String) -> Answer<wit::ObjectMeta> {
        self.regrant()?;
        let started = Instant::now();
        let turn = Arc::clone(&self.caller.turn);
        let here = self.scoped.works_here();
        let r = Self::on_turn(here, &turn, self.scoped.head(&bucket, &key)).await;
        self.read_time += started.elapsed();
        let r = r.ok_or_else(|| self.out_of_time())?;
        match r {
            Ok(m) => {
                self.caller
                    .account
                    .check_incoming(m.guest_bytes(), "object metadata")
                    .map_err(|e| Stop::from(e).trap())?;
                Ok(Ok(meta(m)))
            }
            Err(e) => self.failed(&key, e),
        }
    }

    async fn list(
        &mut self,
        bucket: String,
        prefix: String,
        limit: u32,
    ) -> Answer<Vec<wit::ObjectMeta>> {
        self.regrant()?;
        let started = Instant::now();
        let turn = Arc::clone(&self.caller.turn);
        let here = self.scoped.works_here();
        let r = Self::on_turn(here, &turn, self.scoped.list(&bucket, &prefix, limit)).await;
        self.read_time += started.elapsed();
        let r = r.ok_or_else(|| self.out_of_time())?;
        match r {
            Ok(list) => {
                let bytes = list.iter().map(ObjectMeta::guest_bytes).sum();
                self.caller
                    .account
                    .check_incoming(bytes, "object listing")
                    .map_err(|e| Stop::from(e).trap())?;
                Ok(Ok(list.into_iter().map(meta).collect()))
            }
            Err(e) => self.failed(&prefix, e),
        }
    }
}
