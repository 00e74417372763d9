//! Building tensors from untrusted bytes: every size is checked before libtorch sees the data.

use tch::{Kind, Tensor};

/// Largest tensor built from outside data: 1 GiB of f32. A tenant or client cannot make the
/// process allocate more than this in one tensor, whatever dims it claims.
pub const MAX_TENSOR_BYTES: usize = 1 << 30;

/// Builds an f32 tensor of shape `dims` from little-endian `bytes`, checking that every
/// dimension is positive, that the element count does not overflow, and that the byte length
/// is exactly 4 x elements.
pub fn f32_from_le_bytes(dims: &[i64], bytes: &[u8]) -> Result<Tensor, String> {
    if dims.is_empty() {
        return Err("tensor has no dimensions".into());
    }
    let mut elements: usize = 1;
    for (i, &d) in dims.iter().enumerate() {
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d > 0)
            .ok_or_else(|| format!("dimension {i} is {d}; dimensions must be positive"))?;
        elements = elements
            .checked_mul(d)
            .filter(|&n| n <= MAX_TENSOR_BYTES / 4)
            .ok_or_else(|| format!("dims {dims:?} exceed {MAX_TENSOR_BYTES} bytes"))?;
    }
    if bytes.len() != elements * 4 {
        return Err(format!(
            "dims {dims:?} need {} bytes of f32, got {}",
            elements * 4,
            bytes.len()
        ));
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Tensor::from_slice(&values).reshape(dims))
}

/// The f32 elements of `t` (moved to the CPU) as little-endian bytes.
pub fn f32_to_le_bytes(t: &Tensor) -> Result<Vec<u8>, String> {
    if t.kind() != Kind::Float {
        return Err(format!("element type is {:?}, expected f32", t.kind()));
    }
    let flat = t.to_device(tch::Device::Cpu).contiguous().view(-1);
    let values: Vec<f32> = Vec::try_from(&flat).map_err(|e: tch::TchError| e.to_string())?;
    Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}
