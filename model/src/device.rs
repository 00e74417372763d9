//! Choosing the device: CUDA when present, else CPU.
//!
//! torch-sys links with `--as-needed`, so a binary never references libtorch_cuda.so and CUDA
//! stays invisible to libtorch unless the library is loaded before the first CUDA query. We
//! load it here, once, by name: the binary's run path points at the libtorch that set-up
//! installed, which holds libtorch_cuda.so only in the CUDA build.

use crate::{ModelError, Result};
use std::sync::OnceLock;
use tch::Device;

/// Loads libtorch_cuda.so if this libtorch has it; returns whether CUDA is usable.
pub fn cuda_available() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        // SAFETY: dlopen with a constant, NUL-terminated name; the handle is kept for the
        // life of the process (never dlclosed), as libtorch's registrations require.
        let handle = unsafe {
            libc::dlopen(
                c"libtorch_cuda.so".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_GLOBAL,
            )
        };
        !handle.is_null() && tch::Cuda::is_available()
    })
}

/// Parses a device name: `auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`.
pub fn parse(spec: &str) -> Result<Device> {
    let err = |reason: &str| ModelError::Device {
        spec: spec.to_string(),
        reason: reason.to_string(),
    };
    match spec {
        "auto" => Ok(if cuda_available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }),
        "cpu" => Ok(Device::Cpu),
        _ => {
            let index = match spec.strip_prefix("cuda") {
                Some("") => 0,
                Some(rest) => rest
                    .strip_prefix(':')
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| err("expected auto, cpu, cuda or cuda:N"))?,
                None => return Err(err("expected auto, cpu, cuda or cuda:N")),
            };
            if !cuda_available() {
                return Err(err(
                    "CUDA is not available in this libtorch or on this machine",
                ));
            }
            let count = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
            if index >= count {
                return Err(err(&format!("only {count} CUDA device(s)")));
            }
            Ok(Device::Cuda(index))
        }
    }
}

/// The device named by `HAPI_DEVICE`, default `auto`.
pub fn from_env() -> Result<Device> {
    parse(std::env::var("HAPI_DEVICE").as_deref().unwrap_or("auto"))
}

/// Waits for queued kernels, so that timings cover the work and not its launch.
pub fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}
