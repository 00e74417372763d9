//! The capabilities a pushdown function is granted, one module each, as wasmtime's own
//! capability crates do it: a context that lives in the store, a view that borrows it, and an
//! `add_to_linker`.
//!
//! - [`objects`]: the tenant's granted objects (`hapi:pushdown/objects`);
//! - [`models`]: what the tenant's models want as input (`hapi:pushdown/models`);
//! - [`nn`]: wasi-nn on the host's device, graphs loaded by name only.
//!
//! Every capability charges what it holds or hands over to the invocation's memory account and
//! waits no longer than its deadline ([`caller::Caller`]).

pub mod caller;
pub mod models;
pub mod nn;
pub mod objects;
