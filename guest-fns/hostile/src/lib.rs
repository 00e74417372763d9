//! Test guest: does what its `mode` option asks, to test the host's limits and checks.
//!
//! Modes (option `mode`): `alloc` (allocate and touch `bytes` bytes), `loop` (never return),
//! `spin` (count to `iterations`, then return the count),
//! `output` (return a `bytes`-byte tensor), `read` (read every key; return the bytes),
//! `reread` (read the first key `count` times; return the bytes read), `range` (read `length`
//! bytes at `offset` of the first key), `graph` (load the graph named by
//! option `graph` and run it `count` times (default 1) on a tensor of `dims` with `bytes` bytes
//! of data, keeping the outputs), `tensors` (create `count` tensors of `bytes` bytes and keep
//! them), `inputs` (load the graph of option `graph` and call compute `count` times with two
//! inputs of `bytes` bytes, which it refuses; return how many it refused), `dims` (create
//! `count` tensors of `rank` dimensions of 1 and 4 bytes, keep them),
//! `names` (load `count` graphs named by `bytes` bytes, keeping the error values), `graphs`
//! (load every graph of option `graphs`, comma-separated, and keep them), `list` (list option
//! `prefix`, at most `limit` keys (default 1,000), `count` times (default 1)), `panic`,
//! `bad-output` (dimensions that do not match the data), `long-error` (fail with a
//! `bytes`-byte message), `wide-output` (a tensor of `rank` dimensions of 1 and one byte),
//! `f32-output` (an f32 tensor `[n, 64, 32, 32]` of about `bytes`), `claim-io` (claim a store
//! failure that did not happen), `recurse` (recurse `depth` calls deep), `graph-bytes` (call
//! `graph.load` with `count` graph builders of one byte, all the same byte; return the answer's
//! case, 1 for an error), `describe` (describe a model named by `bytes` bytes; return 1 if
//! refused), `seed` (return the hash std's `RandomState` gives 0, whose keys come from
//! `wasi:random/insecure-seed`), `nn-output` (return, by its handle, a wasi-nn tensor it made
//! of option `type`, `dims` and `bytes`, matching or not). With option `hang`
//! (any value), the guest never returns after the mode's work: a caller that gives up on it
//! still had that work done on its behalf.

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
use bindings::hapi::pushdown::{models, objects};
use bindings::wasi::nn::{graph, tensor};
use bindings::{Error, Guest, Invocation};

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

/// Never returns.
fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

impl Guest for Hostile {
    fn run(inv: Invocation) -> Result<Output, Error> {
        let out = match option(&inv, "mode") {
            Some("nn-output") => nn_output(&inv),
            _ => act(&inv).map(Output::Bytes),
        };
        if option(&inv, "hang").is_some() {
            spin();
        }
        out
    }
}

/// The comma-separated dimensions of option `dims` (default `1`).
fn dims(inv: &Invocation) -> Vec<u32> {
    option(inv, "dims")
        .unwrap_or("1")
        .split(',')
        .map(|d| d.parse().unwrap_or(0))
        .collect()
}

/// `nn-output`: a wasi-nn tensor of option `type` (`fp32`, `fp16`, `bf16`, `fp64`, `u8`, `i32`,
/// `i64`; default `u8`), `dims` and `bytes` bytes of 1, made here and returned by its handle,
/// whether or not its data matches its dimensions.
fn nn_output(inv: &Invocation) -> Result<Output, Error> {
    use tensor::TensorType as T;
    let ty = match option(inv, "type").unwrap_or("u8") {
        "fp32" => T::Fp32,
        "fp16" => T::Fp16,
        "bf16" => T::Bf16,
        "fp64" => T::Fp64,
        "u8" => T::U8,
        "i32" => T::I32,
        "i64" => T::I64,
        other => return Err(Error::BadRequest(format!("unknown type `{other}`"))),
    };
    let data = vec![1u8; number(inv, "bytes")? as usize];
    Ok(Output::Nn(tensor::Tensor::new(&dims(inv), ty, &data)))
}

/// What `mode` asks for.
fn act(inv: &Invocation) -> Result<TensorOut, Error> {
    match option(inv, "mode").unwrap_or("") {
        "alloc" => {
            let n = number(inv, "bytes")? as usize;
            let mut v: Vec<u8> = Vec::new();
            v.resize(n, 1);
            // Touch every page, and return something that depends on it.
            let sum = v.iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>();
            Ok(bytes_out(sum.to_le_bytes().to_vec()))
        }
        "loop" => spin(),
        "output" => Ok(bytes_out(vec![7; number(inv, "bytes")? as usize])),
        "spin" => {
            let mut x: u64 = 0;
            for _ in 0..number(inv, "iterations")? {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            Ok(bytes_out(x.to_le_bytes().to_vec()))
        }
        "read" => {
            let mut all = Vec::new();
            for key in &inv.keys {
                match objects::get(&inv.bucket, key) {
                    Ok(bytes) => all.extend(bytes),
                    // What the host told the guest of a store failure, as the output: a
                    // guest may pass it on.
                    Err(objects::ObjectError::Io(m)) if option(inv, "say") == Some("errors") => {
                        return Ok(bytes_out(m.into_bytes()));
                    }
                    Err(e) => return Err(Error::Object(e)),
                }
            }
            Ok(bytes_out(all))
        }
        "list" => {
            let prefix = option(inv, "prefix").unwrap_or("");
            let limit = number(inv, "limit").map_or(1000, |n| n as u32);
            let mut names = Vec::new();
            for _ in 0..number(inv, "count").unwrap_or(1) {
                let keys = objects::list(&inv.bucket, prefix, limit).map_err(Error::Object)?;
                names = keys.into_iter().map(|m| m.key).collect();
            }
            Ok(bytes_out(names.join("\n").into_bytes()))
        }
        "reread" => {
            let key = inv.keys.first().map(String::as_str).unwrap_or("");
            let mut total = 0u64;
            for _ in 0..number(inv, "count")? {
                total += objects::get(&inv.bucket, key).map_err(Error::Object)?.len() as u64;
            }
            Ok(bytes_out(total.to_le_bytes().to_vec()))
        }
        "graph" => {
            let name = option(inv, "graph").unwrap_or("");
            let dims = dims(inv);
            let n = number(inv, "bytes")? as usize;
            let count = number(inv, "count").unwrap_or(1);
            let g = graph::load_by_name(name)
                .map_err(|e| Error::Inference(format!("{:?}: {}", e.code(), e.data())))?;
            let ctx = g
                .init_execution_context()
                .map_err(|e| Error::Inference(e.data()))?;
            let data = vec![0u8; n];
            let mut kept = Vec::new();
            for _ in 0..count {
                let t = tensor::Tensor::new(&dims, tensor::TensorType::Fp32, &data);
                let out = ctx
                    .compute(vec![("input".to_string(), t)])
                    .map_err(|e| Error::Inference(format!("{:?}: {}", e.code(), e.data())))?;
                kept.extend(out);
            }
            Ok(bytes_out(kept.len().to_le_bytes().to_vec()))
        }
        "inputs" => {
            // `count` computes of two inputs of `bytes` bytes each, every one refused (a compute
            // takes one input): the error values are dropped, the inputs were given away.
            let g = graph::load_by_name(option(inv, "graph").unwrap_or(""))
                .map_err(|e| Error::Inference(format!("{:?}: {}", e.code(), e.data())))?;
            let ctx = g
                .init_execution_context()
                .map_err(|e| Error::Inference(e.data()))?;
            let n = number(inv, "bytes")? as usize;
            let data = vec![0u8; n];
            let mut refused = 0u64;
            for _ in 0..number(inv, "count")? {
                let two = ["a", "b"].map(|name| {
                    let t = tensor::Tensor::new(&[n as u32 / 4], tensor::TensorType::Fp32, &data);
                    (name.to_string(), t)
                });
                if ctx.compute(two.into()).is_err() {
                    refused += 1;
                }
            }
            Ok(bytes_out(refused.to_le_bytes().to_vec()))
        }
        "range" => {
            let key = inv.keys.first().map(String::as_str).unwrap_or("");
            let (offset, length) = (number(inv, "offset")?, number(inv, "length")?);
            let data =
                objects::get_range(&inv.bucket, key, offset, length).map_err(Error::Object)?;
            Ok(bytes_out(data))
        }
        "dims" => {
            let (count, rank) = (number(inv, "count")?, number(inv, "rank")? as usize);
            let dims = vec![1u32; rank];
            let kept: Vec<tensor::Tensor> = (0..count)
                .map(|_| tensor::Tensor::new(&dims, tensor::TensorType::Fp32, &[0; 4]))
                .collect();
            Ok(bytes_out((kept.len() as u64).to_le_bytes().to_vec()))
        }
        "names" => {
            let (count, n) = (number(inv, "count")?, number(inv, "bytes")? as usize);
            let name = format!("{}[0..1]", "a".repeat(n));
            let kept: Vec<_> = (0..count)
                .filter_map(|_| graph::load_by_name(&name).err())
                .collect();
            Ok(bytes_out((kept.len() as u64).to_le_bytes().to_vec()))
        }
        "graphs" => {
            let mut kept = Vec::new();
            for name in option(inv, "graphs").unwrap_or("").split(',') {
                let g = graph::load_by_name(name).map_err(|e| {
                    Error::Inference(format!("{name}: {:?}: {}", e.code(), e.data()))
                })?;
                kept.push(g);
            }
            Ok(bytes_out((kept.len() as u64).to_le_bytes().to_vec()))
        }
        "long-error" => Err(Error::BadRequest(
            "e".repeat(number(inv, "bytes")? as usize),
        )),
        // An f32 tensor [n, 64, 32, 32] of about `bytes` (whole samples, at least one), every
        // value 0.747: what the host's int8 quantization works through.
        "f32-output" => {
            let sample = 64 * 32 * 32 * 4;
            let n = (number(inv, "bytes")? as usize / sample).max(1);
            Ok(TensorOut {
                dimensions: vec![n as u32, 64, 32, 32],
                ty: ElementType::F32,
                data: vec![0x3f; n * sample],
            })
        }
        "wide-output" => Ok(TensorOut {
            dimensions: vec![1; number(inv, "rank")? as usize],
            ty: ElementType::U8,
            data: vec![1],
        }),
        "recurse" => {
            let sum = recurse(number(inv, "depth")?);
            Ok(bytes_out(sum.to_le_bytes().to_vec()))
        }
        "claim-io" => Err(Error::Object(objects::ObjectError::Io(
            "the disk is on fire".into(),
        ))),
        "tensors" => {
            let (count, n) = (number(inv, "count")?, number(inv, "bytes")? as usize);
            let data = vec![0u8; n];
            let kept: Vec<tensor::Tensor> = (0..count)
                .map(|_| tensor::Tensor::new(&[n as u32 / 4], tensor::TensorType::Fp32, &data))
                .collect();
            Ok(bytes_out((kept.len() as u64).to_le_bytes().to_vec()))
        }
        "graph-bytes" => {
            let byte = 0u8;
            let lists = vec![[&raw const byte as u32, 1u32]; number(inv, "count")? as usize];
            // The result's case (u8) and its handle, at offsets 0 and 4.
            let mut answer = [0u32; 2];
            // SAFETY: `lists` is the canonical ABI's `list<list<u8>>` (pointer and length pairs
            // into this memory), `answer` has room for `result<graph, error>`; the handle
            // returned is left to the invocation's end.
            unsafe {
                raw_graph_load(
                    lists.as_ptr(),
                    lists.len(),
                    0,
                    0,
                    answer.as_mut_ptr().cast(),
                );
            }
            Ok(bytes_out(answer[0].to_le_bytes().to_vec()))
        }
        "describe" => {
            let name = "a".repeat(number(inv, "bytes")? as usize);
            let refused = u32::from(models::describe(&name).is_err());
            Ok(bytes_out(refused.to_le_bytes().to_vec()))
        }
        "seed" => {
            use std::hash::BuildHasher;
            let hash = std::collections::hash_map::RandomState::new().hash_one(0u64);
            Ok(bytes_out(hash.to_le_bytes().to_vec()))
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

#[link(wasm_import_module = "wasi:nn/graph@0.2.0-rc-2024-10-28")]
unsafe extern "C" {
    /// `graph.load` as the canonical ABI lowers it: the builders as a list of (pointer,
    /// length) pairs of the guest's choosing, which the generated binding would copy first.
    #[link_name = "load"]
    fn raw_graph_load(lists: *const [u32; 2], len: usize, encoding: i32, target: i32, out: *mut u8);
}

/// Recursion the optimiser cannot turn into a loop: every call takes a frame of Wasm's own
/// stack (the one the host bounds), none of the guest's memory.
fn recurse(depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    std::hint::black_box(recurse(std::hint::black_box(depth - 1))).wrapping_add(depth)
}

bindings::export!(Hostile with_types_in bindings);
