//! `decode-bench`: times what `feature-extract` does to each object (decode, then preprocess
//! into tensor bytes) inside the sandbox, by the guest's own monotonic clock, so that the host
//! bench can set it against the same loop run natively.
//!
//! For each key it reads the object once, runs two untimed rounds (the instance's memory grows
//! to its working size), then `reps` timed rounds (option `reps`, 1..=1000, default 20), and
//! returns an F32 tensor `[keys, reps, 2]` of milliseconds: decoding, then preprocessing
//! (resize, crop, normalisation into tensor bytes). The transform is `model`'s. It imports
//! `wasi:clocks`, so only tenants granted `clocks` may run it.

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

use bindings::hapi::pushdown::models;
use bindings::hapi::pushdown::objects;
use bindings::hapi::pushdown::types::{ElementType, ObjectFailure, Output, TensorOut};
use bindings::{Error, Guest, Invocation};
use hapi_preprocess::{Transform, decode, transform_into_le_bytes};
use std::time::Instant;

struct DecodeBench;

impl Guest for DecodeBench {
    fn run(inv: Invocation) -> Result<Output, Error> {
        let mut reps = 20usize;
        for (key, value) in &inv.options {
            match (key.as_str(), value.parse::<usize>()) {
                ("reps", Ok(n @ 1..=1000)) => reps = n,
                _ => {
                    return Err(Error::BadRequest(format!(
                        "option `{key}` = `{value}`: decode-bench takes `reps` (1..=1000)"
                    )));
                }
            }
        }
        let model = inv
            .model
            .as_deref()
            .ok_or_else(|| Error::BadRequest("decode-bench needs `model`".into()))?;
        let info = models::describe(model).map_err(Error::BadRequest)?;
        let spec = &info.input;
        let t = Transform::from_lists(spec.resize, spec.crop, &spec.mean, &spec.std)
            .map_err(|e| Error::Inference(format!("model `{}`: {e}", info.name)))?;
        let mut times = Vec::with_capacity(inv.keys.len() * reps * 8);
        let mut out = Vec::with_capacity(4 * t.sample_len());
        for key in &inv.keys {
            let bytes = objects::get(&inv.bucket, key).map_err(Error::Object)?;
            // (decode, preprocess) milliseconds of one round.
            let once = |out: &mut Vec<u8>| -> Result<[f32; 2], Error> {
                out.clear();
                let bad = |reason: String| {
                    Error::BadObject(ObjectFailure {
                        key: key.clone(),
                        reason,
                    })
                };
                let t0 = Instant::now();
                let image = decode(&bytes).map_err(|e| bad(e.to_string()))?;
                let t1 = Instant::now();
                transform_into_le_bytes(&image, &t, out).map_err(|e| bad(e.to_string()))?;
                let ms = |d: std::time::Duration| d.as_secs_f32() * 1e3;
                Ok([ms(t1 - t0), ms(t1.elapsed())])
            };
            for _ in 0..2 {
                once(&mut out)?;
            }
            for _ in 0..reps {
                for ms in once(&mut out)? {
                    times.extend_from_slice(&ms.to_le_bytes());
                }
            }
        }
        Ok(Output::Bytes(TensorOut {
            dimensions: vec![inv.keys.len() as u32, reps as u32, 2],
            ty: ElementType::F32,
            data: times,
        }))
    }
}

bindings::export!(DecodeBench with_types_in bindings);
