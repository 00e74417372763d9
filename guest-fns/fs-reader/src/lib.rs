//! Test guest: a pushdown function that reads `/etc/passwd` through WASI's filesystem. It
//! imports `wasi:filesystem`, which no tenant is granted, so the host must refuse to deploy it.

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

use bindings::hapi::pushdown::types::{ElementType, Output, TensorOut};
use bindings::{Error, Guest, Invocation};

struct FsReader;

impl Guest for FsReader {
    fn run(_invocation: Invocation) -> Result<Output, Error> {
        let data = std::fs::read("/etc/passwd").map_err(|e| Error::BadRequest(e.to_string()))?;
        Ok(Output::Bytes(TensorOut {
            dimensions: vec![data.len() as u32],
            ty: ElementType::U8,
            data,
        }))
    }
}

bindings::export!(FsReader with_types_in bindings);
