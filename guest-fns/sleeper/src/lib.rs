//! Test guest: sleeps for option `ms` milliseconds through `wasi:clocks` (std's
//! `thread::sleep` subscribes to the monotonic clock and blocks on the pollable, a host call
//! that waits), then returns how long it slept by its own clock. It imports `wasi:clocks`, so
//! only tenants granted `clocks` may deploy it.

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

use bindings::hapi::pushdown::types::ElementType;
use bindings::{Error, Guest, Invocation, TensorOut};
use std::time::{Duration, Instant};

struct Sleeper;

impl Guest for Sleeper {
    fn run(inv: Invocation) -> Result<TensorOut, Error> {
        let ms: u64 = inv
            .options
            .iter()
            .find(|(k, _)| k == "ms")
            .and_then(|(_, v)| v.parse().ok())
            .ok_or_else(|| Error::BadRequest("option `ms` (a number) is required".into()))?;
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(ms));
        let slept = started.elapsed().as_millis() as u64;
        Ok(TensorOut {
            dimensions: vec![8],
            ty: ElementType::U8,
            data: slept.to_le_bytes().to_vec(),
        })
    }
}

bindings::export!(Sleeper with_types_in bindings);
