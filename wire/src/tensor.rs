//! The response body of an invocation: a safetensors file holding one tensor, `features`.
//!
//! The host writes the header itself ([`header`]) and sends the tensor's bytes after it as they
//! are, without a copy; any safetensors reader (the trainer uses the `safetensors` crate,
//! PyTorch users `safetensors.torch.load`) reads it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most dimensions an output tensor may have: every model output here has at most 4, and a
/// header grows with the rank.
pub const MAX_RANK: usize = 8;
/// Name of the tensor in a response.
pub const FEATURES: &str = "features";

/// Element types a response may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    U8,
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16 (an f32's upper 16 bits).
    BF16,
    /// Signed bytes (int8 features, with their scales: [`crate::quantize`]).
    I8,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::I64 => 8,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }

    /// The name in a safetensors header.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::U8 => "U8",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I8 => "I8",
        }
    }
}

/// The element type float features travel in. f16 and bf16 (`feature-extract`'s `dtype`
/// option, the graph name's `@f16`/`@bf16`): the host's device narrows to it, the client widens
/// back to f32; they halve the bytes on the network. int8: the function answers in f32 and the
/// host quantizes its output with per-channel scales (the invocation's `quantize`,
/// [`crate::quantize`]): about a quarter of the bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireDtype {
    #[default]
    F32,
    F16,
    Bf16,
    Int8,
}

impl WireDtype {
    /// Bytes per element on the wire (int8's scales aside: [`WireDtype::sample_bytes`]).
    pub fn size(self) -> u64 {
        match self {
            WireDtype::F32 => 4,
            WireDtype::F16 | WireDtype::Bf16 => 2,
            WireDtype::Int8 => 1,
        }
    }

    /// Bytes one sample of `per_sample` shape (no batch dimension) takes on the wire.
    pub fn sample_bytes(self, per_sample: &[u64]) -> u64 {
        match self {
            WireDtype::Int8 => crate::quantize::sample_bytes(per_sample),
            other => other.size() * per_sample.iter().product::<u64>(),
        }
    }

    /// The safetensors element type it is sent as.
    pub fn dtype(self) -> Dtype {
        match self {
            WireDtype::F32 => Dtype::F32,
            WireDtype::F16 => Dtype::F16,
            WireDtype::Bf16 => Dtype::BF16,
            WireDtype::Int8 => Dtype::I8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WireDtype::F32 => "f32",
            WireDtype::F16 => "f16",
            WireDtype::Bf16 => "bf16",
            WireDtype::Int8 => "int8",
        }
    }
}

impl std::str::FromStr for WireDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::Bf16),
            "int8" => Ok(Self::Int8),
            other => Err(format!("`{other}`: expected f32, f16, bf16 or int8")),
        }
    }
}

impl std::fmt::Display for WireDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes `shape` of `dtype` take, or why the shape is not acceptable (rank, overflow).
pub fn data_len(dtype: Dtype, shape: &[u64]) -> Result<u64, String> {
    if shape.is_empty() || shape.len() > MAX_RANK {
        return Err(format!(
            "a tensor of rank {}; 1..={MAX_RANK} dimensions are allowed",
            shape.len()
        ));
    }
    shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("dimensions {shape:?} overflow"))
}

/// The safetensors header (length prefix and JSON, padded to 8 bytes) for one tensor named
/// [`FEATURES`] of `dtype` and `shape` holding `data_len` bytes, with string `metadata`.
pub fn header(
    dtype: Dtype,
    shape: &[u64],
    data_len: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, String> {
    let need = self::data_len(dtype, shape)?;
    if need != data_len {
        return Err(format!(
            "dimensions {shape:?} of {} need {need} bytes; the data has {data_len}",
            dtype.name()
        ));
    }
    write_header(metadata, &[(FEATURES, dtype, shape, [0, data_len])])
}

/// A safetensors header (length prefix and JSON, padded to 8 bytes) with string `metadata` and
/// `tensors`: name, type, shape and where its bytes lie in the data.
pub(crate) fn write_header(
    metadata: &BTreeMap<String, String>,
    tensors: &[(&str, Dtype, &[u64], [u64; 2])],
) -> Result<Vec<u8>, String> {
    let mut json = serde_json::Map::new();
    if !metadata.is_empty() {
        json.insert("__metadata__".into(), serde_json::json!(metadata));
    }
    for (name, dtype, shape, offsets) in tensors {
        json.insert(
            (*name).into(),
            serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": offsets}),
        );
    }
    let mut text = serde_json::to_vec(&json).map_err(|e| e.to_string())?;
    // Readers may map the data; keep it 8-byte aligned as the format's own writer does.
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(header: &[u8], data: &[u8]) -> (Vec<usize>, Vec<u8>, Option<String>) {
        let mut file = header.to_vec();
        file.extend_from_slice(data);
        let st = safetensors::SafeTensors::deserialize(&file).expect("readable safetensors");
        let t = st.tensor(FEATURES).expect("features");
        let (_, meta) = safetensors::SafeTensors::read_metadata(&file).expect("metadata");
        let tenant = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("tenant").cloned());
        (t.shape().to_vec(), t.data().to_vec(), tenant)
    }

    #[test]
    fn a_tensor_reads_back_with_its_metadata() {
        let data: Vec<u8> = (0..24u8).collect();
        let meta = BTreeMap::from([("tenant".to_string(), "alice \"q\"".to_string())]);
        let h = header(Dtype::F32, &[2, 3], 24, &meta).expect("header");
        assert_eq!(h.len() % 8, 0);
        let (shape, back, tenant) = read(&h, &data);
        assert_eq!(shape, [2, 3]);
        assert_eq!(back, data);
        assert_eq!(tenant.as_deref(), Some("alice \"q\""));
    }

    #[test]
    fn ranks_and_sizes_that_do_not_agree_are_refused() {
        let none = BTreeMap::new();
        assert!(header(Dtype::F32, &[], 0, &none).is_err());
        assert!(header(Dtype::U8, &[1; MAX_RANK], 1, &none).is_ok());
        assert!(header(Dtype::U8, &[1; MAX_RANK + 1], 1, &none).is_err());
        assert!(header(Dtype::F32, &[2, 3], 23, &none).is_err());
        assert!(header(Dtype::I64, &[u64::MAX, 2], 0, &none).is_err());
    }

    proptest! {
        /// Any shape within the rank bound either encodes to a file a safetensors reader
        /// accepts with the same shape, or is refused with a message; nothing panics.
        #[test]
        fn shapes_encode_or_are_refused(
            shape in proptest::collection::vec(0u64..6, 0..10),
            extra in 0u64..3,
            key in "[a-z]{0,6}",
            value in ".{0,20}",
        ) {
            let meta = BTreeMap::from([(key, value)]);
            match data_len(Dtype::U8, &shape) {
                Ok(n) => {
                    let h = header(Dtype::U8, &shape, n, &meta).expect("consistent header");
                    let (back, data, _) = read(&h, &vec![7u8; n as usize]);
                    prop_assert_eq!(back, shape.iter().map(|&d| d as usize).collect::<Vec<_>>());
                    prop_assert_eq!(data.len() as u64, n);
                    if extra > 0 {
                        prop_assert!(header(Dtype::U8, &shape, n + extra, &meta).is_err());
                    }
                }
                Err(e) => {
                    prop_assert!(!e.is_empty());
                    prop_assert!(header(Dtype::U8, &shape, 0, &meta).is_err());
                }
            }
        }
    }
}
