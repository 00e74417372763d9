//! Test guest: does what its `mode` option asks, to test the host's limits and checks.
//!
//! Modes (option `mode`): `alloc` (allocate and touch `bytes` bytes), `loop` (never return),
//! `spin` (count to `iterations`, then return the count),
//! `output` (return a `bytes`-byte tensor), `read` (read every key; return the bytes),
//! `graph` (load the graph named by option `graph` and run it on a tensor of `dims` with
//! `bytes` bytes of data), `tensors` (create `count` tensors of `bytes` bytes and keep them),
//! `list` (list option `prefix`), `panic`, `bad-output` (dimensions that do not match the data).

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

use bindings::hapi::pushdown::objects;
use bindings::hapi::pushdown::types::ElementType;
use bindings::wasi::nn::{graph, tensor};
use bindings::{Error, Guest, Invocation, TensorOut};

struct Hostile;

fn option<'a>(inv: &'a Invocation, name: &str) -> Option<&'a str> {
    inv.options
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn number(inv: &Invocation, name: &str) -> Result<u64, Error> {
    option(inv, name)
        .ok_or_else(|| Error::BadRequest(format!("option `{name}` is required")))?
        .parse()
        .map_err(|_| Error::BadRequest(format!("option `{name}` is not a number")))
}

fn bytes_out(data: Vec<u8>) -> TensorOut {
    TensorOut {
        dimensions: vec![data.len().max(1) as u32],
        ty: ElementType::U8,
        data: if data.is_empty() { vec![0] } else { data },
    }
}

impl Guest for Hostile {
    fn run(inv: Invocation) -> Result<TensorOut, Error> {
        match option(&inv, "mode").unwrap_or("") {
            "alloc" => {
                let n = number(&inv, "bytes")? as usize;
                let mut v: Vec<u8> = Vec::new();
                v.resize(n, 1);
                // Touch every page, and return something that depends on it.
                let sum = v.iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>();
                Ok(bytes_out(sum.to_le_bytes().to_vec()))
            }
            "loop" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "output" => Ok(bytes_out(vec![7; number(&inv, "bytes")? as usize])),
            "spin" => {
                let mut x: u64 = 0;
                for _ in 0..number(&inv, "iterations")? {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                Ok(bytes_out(x.to_le_bytes().to_vec()))
            }
            "read" => {
                let mut all = Vec::new();
                for key in &inv.keys {
                    all.extend(objects::get(&inv.bucket, key).map_err(Error::Object)?);
                }
                Ok(bytes_out(all))
            }
            "list" => {
                let prefix = option(&inv, "prefix").unwrap_or("");
                let keys = objects::list(&inv.bucket, prefix, 1000).map_err(Error::Object)?;
                let names: Vec<String> = keys.into_iter().map(|m| m.key).collect();
                Ok(bytes_out(names.join("\n").into_bytes()))
            }
            "graph" => {
                let name = option(&inv, "graph").unwrap_or("");
                let dims: Vec<u32> = option(&inv, "dims")
                    .unwrap_or("1")
                    .split(',')
                    .map(|d| d.parse().unwrap_or(0))
                    .collect();
                let n = number(&inv, "bytes")? as usize;
                let g = graph::load_by_name(name)
                    .map_err(|e| Error::Inference(format!("{:?}: {}", e.code(), e.data())))?;
                let ctx = g
                    .init_execution_context()
                    .map_err(|e| Error::Inference(e.data()))?;
                let t = tensor::Tensor::new(&dims, tensor::TensorType::Fp32, &vec![0u8; n]);
                let out = ctx
                    .compute(vec![("input".to_string(), t)])
                    .map_err(|e| Error::Inference(format!("{:?}: {}", e.code(), e.data())))?;
                Ok(bytes_out(out.len().to_le_bytes().to_vec()))
            }
            "tensors" => {
                let (count, n) = (number(&inv, "count")?, number(&inv, "bytes")? as usize);
                let data = vec![0u8; n];
                let kept: Vec<tensor::Tensor> = (0..count)
                    .map(|_| tensor::Tensor::new(&[n as u32 / 4], tensor::TensorType::Fp32, &data))
                    .collect();
                Ok(bytes_out((kept.len() as u64).to_le_bytes().to_vec()))
            }
            "panic" => panic!("hostile guest panics on request"),
            "bad-output" => Ok(TensorOut {
                dimensions: vec![1000, 1000],
                ty: ElementType::F32,
                data: vec![0; 16],
            }),
            other => Err(Error::BadRequest(format!("unknown mode `{other}`"))),
        }
    }
}

bindings::export!(Hostile with_types_in bindings);
