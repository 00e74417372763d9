//! One device batch: slices of calls' inputs in, the segment run, each slice's output copied
//! into its call's buffer. Every libtorch call here is the fallible `f_` form, and the whole of
//! it runs under `catch_unwind`, so a libtorch error or a panic fails this batch's calls and
//! nothing else.

use hapi_model::ModelPackage;
use std::ops::Range;
use tch::{Device, Kind, Tensor};

use crate::device::job::{WireDtype, torch_kind};

/// Bytes of one f32 element: inputs are f32, in the machine's (little-endian) order, and so are
/// outputs unless a call asks for a narrower [`WireDtype`].
const F32: usize = 4;
#[cfg(not(target_endian = "little"))]
compile_error!(
    "tensor bytes are exchanged as little-endian f32: a big-endian host needs byte swaps"
);

/// Where a slice's output goes.
#[derive(Debug)]
pub struct Dest<'a> {
    pub out: &'a mut Vec<u8>,
    pub take: i64,
    /// The element type this slice's output is written in.
    pub kind: WireDtype,
}

/// Runs layers `range` of `model` on the concatenation of `inputs` (each a whole number of
/// samples of `shape`) and appends each input's output to its `dests` entry, narrowed on the
/// device to the entry's [`WireDtype`]. The output of each sample must have `out_shape`.
pub fn run(
    model: &ModelPackage,
    range: Range<usize>,
    shape: &[i64],
    out_shape: &[i64],
    inputs: &[&[u8]],
    dests: &mut [Dest<'_>],
) -> Result<(), String> {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_inner(model, range, shape, out_shape, inputs, dests)
    }));
    caught.unwrap_or_else(|panic| {
        Err(format!(
            "panic while running a batch: {}",
            crate::account::text::panic_message(panic.as_ref())
        ))
    })
}

fn run_inner(
    model: &ModelPackage,
    range: Range<usize>,
    shape: &[i64],
    out_shape: &[i64],
    inputs: &[&[u8]],
    dests: &mut [Dest<'_>],
) -> Result<(), String> {
    let size: i64 = dests.iter().map(|d| d.take).sum();
    let dims: Vec<i64> = std::iter::once(size).chain(shape.iter().copied()).collect();
    let need: usize = dims
        .iter()
        .try_fold(F32, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .ok_or("batch dimensions overflow")?;
    let given: usize = inputs.iter().map(|i| i.len()).sum();
    if given != need {
        return Err(format!(
            "batch input is {given} bytes; {dims:?} of f32 need {need}"
        ));
    }
    let x = match inputs {
        [one] => Tensor::f_from_data_size(one, &dims, Kind::Float).map_err(|e| e.to_string())?,
        // The calls' slices copied into the batch's tensor one after the other. They were
        // joined into one buffer first, and the tensor copied from it: a second copy of the
        // whole batch's input, up to `max_batch` samples per worker, that no memory model or
        // account counted.
        many => {
            let x =
                Tensor::f_empty(&dims, (Kind::Float, Device::Cpu)).map_err(|e| e.to_string())?;
            if need == 0 {
                return Err("an empty batch".into());
            }
            if !x.is_contiguous() || x.numel() * F32 != need {
                return Err(format!("the batch's tensor is not {need} contiguous bytes"));
            }
            let base = x.data_ptr().cast::<u8>();
            let mut at = 0;
            for part in many {
                // SAFETY: `x` was just made, contiguous, on the CPU, of `need` bytes, and
                // nothing else refers to it; the parts' lengths sum to `need`, so each copy
                // stays within it, and a Rust slice never overlaps libtorch's new storage.
                unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), base.add(at), part.len()) };
                at += part.len();
            }
            x
        }
    };
    let x = if model.device() == Device::Cpu {
        x
    } else {
        x.f_to_device(model.device()).map_err(|e| e.to_string())?
    };
    let y = model.run(range, &x).map_err(|e| e.to_string())?;
    drop(x);
    if y.kind() != Kind::Float {
        return Err(format!("the segment returned {:?}, not f32", y.kind()));
    }
    let want: Vec<i64> = std::iter::once(size)
        .chain(out_shape.iter().copied())
        .collect();
    if y.size() != want {
        return Err(format!(
            "the segment returned {:?}, expected {want:?}",
            y.size()
        ));
    }
    let per_sample: usize = out_shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .ok_or("output dimensions overflow")?;
    let mut offset = 0i64;
    for d in dests.iter_mut() {
        let part = y.f_narrow(0, offset, d.take).map_err(|e| e.to_string())?;
        // Narrowed where the batch ran (on a GPU, before the copy to the host), then copied.
        let part = if d.kind == WireDtype::F32 {
            part
        } else {
            part.f_to_kind(torch_kind(d.kind))
                .map_err(|e| e.to_string())?
        };
        let part = part
            .f_to_device(Device::Cpu)
            .and_then(|p| p.f_contiguous())
            .map_err(|e| e.to_string())?;
        let numel = per_sample * usize::try_from(d.take).map_err(|_| "negative slice")?;
        let start = d.out.len();
        d.out.resize(start + numel * d.kind.size() as usize, 0);
        part.f_copy_data_u8(&mut d.out[start..], numel)
            .map_err(|e| e.to_string())?;
        offset += d.take;
    }
    hapi_model::device::synchronize(model.device());
    Ok(())
}
