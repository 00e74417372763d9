//! Test guest for the grantable WASI interfaces. With option `ms`, it sleeps that many
//! milliseconds through `wasi:clocks` (std's `thread::sleep` subscribes to the monotonic clock
//! and blocks on the pollable, a host call that waits), holding `touch` bytes of memory it
//! wrote (option `touch`, default 0), then returns how long it slept by its own clock. With option `random`, it asks `wasi:random` for that many bytes in one call and
//! returns how many it got. It imports `wasi:clocks` and `wasi:random`, so only tenants granted
//! both may run it.

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

/// `wasi:random@0.2.0`'s interface (as wasi-libc links it), declared here because the
/// project's WIT (`../../wit`) does not carry the package.
mod random {
    wit_bindgen::generate!({
        inline: "
            package wasi:random@0.2.0;
            interface random {
                get-random-bytes: func(len: u64) -> list<u8>;
                get-random-u64: func() -> u64;
            }
            world imports {
                import random;
            }
        ",
    });
}

use bindings::hapi::pushdown::types::{ElementType, Output, TensorOut};
use bindings::{Error, Guest, Invocation};
use std::time::{Duration, Instant};

struct Sleeper;

impl Guest for Sleeper {
    fn run(inv: Invocation) -> Result<Output, Error> {
        let number = |key: &str| -> Option<u64> {
            inv.options
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.parse().ok())
        };
        if let Some(len) = number("random") {
            let got = random::wasi::random::random::get_random_bytes(len).len() as u64;
            return Ok(Output::Bytes(TensorOut {
                dimensions: vec![8],
                ty: ElementType::U8,
                data: got.to_le_bytes().to_vec(),
            }));
        }
        let ms = number("ms").ok_or_else(|| {
            Error::BadRequest("option `ms` or `random` (a number) is required".into())
        })?;
        // Memory it holds while it sleeps: `touch` bytes, each page written.
        let held = vec![1u8; number("touch").unwrap_or(0) as usize];
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(ms));
        std::hint::black_box(&held);
        let slept = started.elapsed().as_millis() as u64;
        Ok(Output::Bytes(TensorOut {
            dimensions: vec![8],
            ty: ElementType::U8,
            data: slept.to_le_bytes().to_vec(),
        }))
    }
}

bindings::export!(Sleeper with_types_in bindings);
