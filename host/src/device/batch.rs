//! One device batch: slices of calls' inputs in, the segment run, each slice's output copied
//! into its call's buffer. Every libtorch call here is the fallible `f_` form, and the whole of
//! it runs under `catch_unwind`, so a libtorch error or a panic fails this batch's calls and
//! nothing else.

use hapi_model::ModelPackage;
use std::ops::Range;
use std::time::{Duration, Instant};
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
    /// Set by [`run`]: the time its own part took once the batch had run (its slice narrowed
    /// to `kind`, copied to the host and into `out`), which its call alone is charged.
    pub took: Duration,
}

/// Each of a batch's calls' device time, of a batch that took `took` in all: the time its own
/// part took (`own`, [`Dest::took`]) and a share of the rest by its samples (`takes`). Split
/// by samples alone, an f32 call pooled with one narrowed to bf16 (dear on a CPU without bf16
/// instructions) paid part of the narrowing.
pub fn shares(took: Duration, own: &[Duration], takes: &[i64]) -> Vec<Duration> {
    let common = took.saturating_sub(own.iter().sum());
    let size: i64 = takes.iter().sum();
    takes
        .iter()
        .zip(own.iter().chain(std::iter::repeat(&Duration::ZERO)))
        .map(|(&take, &own)| common.mul_f64(take as f64 / size.max(1) as f64) + own)
        .collect()
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
    // The batch's own work ends here (on a GPU, its kernels were only queued): what follows
    // is each call's.
    hapi_model::device::synchronize(model.device());
    let mut offset = 0i64;
    for d in dests.iter_mut() {
        let started = Instant::now();
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
        d.took = started.elapsed();
    }
    hapi_model::device::synchronize(model.device());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Duration, shares};

    #[test]
    fn each_call_pays_its_own_part_and_a_share_of_the_rest_by_samples() {
        let ms = Duration::from_millis;
        // 100 ms in all: 20 ms narrowing the second call's slice to bf16, 4 ms copying the
        // first's; the 76 ms of the batch itself by samples, 3 to 1.
        let s = shares(ms(100), &[ms(4), ms(20)], &[12, 4]);
        assert_eq!(s, [ms(57) + ms(4), ms(19) + ms(20)]);
        assert_eq!(s.iter().sum::<Duration>(), ms(100));
        // By samples alone, the f32 call had paid 75 ms.
        // Own parts longer than the whole (clock steps): the rest is none, never negative.
        assert_eq!(shares(ms(10), &[ms(8), ms(8)], &[1, 1]), [ms(8), ms(8)]);
        // No own parts measured (a failed batch): by samples.
        assert_eq!(shares(ms(10), &[], &[1, 4]), [ms(2), ms(8)]);
    }
}
