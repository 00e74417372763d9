//! The Wasm runtime: one engine, tenants' components checked, compiled and pre-instantiated
//! once, and a fresh, limited store per invocation.
//!
//! - [`engine`]: the engine (pooling allocator, epoch interruption, async host calls) and its
//!   epoch clock;
//! - [`limits`]: what a store may grow to, charged to the invocation's memory account;
//! - [`errors`]: every way an invocation can fail, classified in one place;
//! - [`compile`]: a component checked (size, structure, imports) before it is compiled;
//! - [`cpu`]: the invocation workers' time shared by tenant;
//! - [`invoke`]: an invocation's store, its capabilities, and its deadline;
//! - [`poll`]: `wasi:io/poll` with a bound on the list a guest polls.

pub mod compile;
pub mod cpu;
pub mod engine;
pub mod errors;
pub mod invoke;
pub mod limits;
pub mod poll;
