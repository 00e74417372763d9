//! Host bindings of the `hapi:pushdown/pushdown` world (and the wasi-nn it imports), generated
//! from `wit/`. Every import is async (host calls wait for objects, models and the device, and
//! end at the invocation's deadline) and trappable (a guest that breaks a limit inside a host
//! call is stopped there).

wasmtime::component::bindgen!({
    world: "hapi:pushdown/pushdown",
    path: "../wit",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "wasi:nn/graph.graph": crate::caps::nn::resources::Graph,
        "wasi:nn/tensor.tensor": crate::caps::nn::resources::Tensor,
        "wasi:nn/inference.graph-execution-context": crate::caps::nn::resources::Context,
        "wasi:nn/errors.error": crate::caps::nn::resources::NnError,
    },
});

pub use hapi::pushdown::types::{ElementType, Error as GuestError};
