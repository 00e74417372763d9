//! wasi-nn for pushdown functions, on libtorch through the host's [`Device`](crate::device::Device).
//!
//! Graphs are only loaded by name, `<model>[a..b]` for layers [a, b) of a model package the
//! tenant may use; loading one loads the package (its weights charged to the device budget).
//! Tenant-supplied graph bytes are refused: a TorchScript file can call arbitrary operators,
//! including file I/O.
//!
//! Every tensor, dimension list, error value and handle the host keeps for a guest is charged
//! to the invocation's memory account; every tensor is checked (element type, rank, per-sample
//! shape against the manifest, byte length) before libtorch sees it; a compute call waits for
//! the device no longer than the invocation's deadline.

pub mod host;
pub mod resources;

pub use host::{NnCtx, add_to_linker};
