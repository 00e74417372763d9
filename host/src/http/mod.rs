//! The HTTP API (axum over hyper), with the connection limits and timeouts a public endpoint
//! needs.
//!
//! - [`server`]: the accept loop: a cap on connections (in all and per client address), header
//!   and idle-write timeouts, graceful shutdown;
//! - [`router`]: routes, request ids, and JSON errors for everything the server sends;
//! - [`errors`]: one table from the host's errors to status and code;
//! - [`extract`]: bearer tokens (tenant or operator), names in paths, bodies read with a limit
//!   and a timeout;
//! - [`invoke`], [`functions`], [`models`], [`placement`]: the handlers.
//!
//! The HTTP layer knows the wire contract (`hapi-wire`), not the guest ABI.

pub mod conns;
pub mod errors;
pub mod extract;
pub mod functions;
pub mod invoke;
pub mod models;
pub mod placement;
pub mod router;
pub mod server;

pub use router::{metrics_router, router};
pub use server::serve;
