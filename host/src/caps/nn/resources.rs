//! What wasi-nn handles hold, and the checks on what guests send: graph names and tensors.

use crate::account::Charge;
use crate::account::text::quote;
use crate::device::WireDtype;
use std::ops::Range;

/// Most dimensions a tensor given to compute may have (every model input here has 4).
pub const MAX_RANK: usize = 8;

/// Element types of tensors (wasi-nn's `tensor-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    U8,
    I32,
    I64,
}

impl ElemType {
    pub fn size(self) -> usize {
        match self {
            ElemType::Fp16 | ElemType::Bf16 => 2,
            ElemType::Fp32 | ElemType::I32 => 4,
            ElemType::Fp64 | ElemType::I64 => 8,
            ElemType::U8 => 1,
        }
    }

    /// wasi-nn's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            ElemType::Fp16 => "fp16",
            ElemType::Fp32 => "fp32",
            ElemType::Fp64 => "fp64",
            ElemType::Bf16 => "bf16",
            ElemType::U8 => "u8",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
        }
    }
}

/// wasi-nn's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    RuntimeError,
    TooLarge,
    NotFound,
    Security,
}

/// A loaded graph: layers `range` of model `model`, whose input has `input_shape` per sample.
#[derive(Debug)]
pub struct Graph {
    pub info: std::sync::Arc<GraphInfo>,
    pub charge: Charge,
}

#[derive(Debug)]
pub struct GraphInfo {
    pub model: String,
    pub range: Range<usize>,
    pub input_shape: Vec<i64>,
    /// The element type of the graph's output (`@f16`, `@bf16`; FP32 without a suffix).
    pub out: WireDtype,
}

/// An execution context of a graph.
#[derive(Debug)]
pub struct Context {
    pub info: std::sync::Arc<GraphInfo>,
    pub charge: Charge,
}

/// A tensor the host holds for a guest; `charge` covers its handle, dimensions and data.
#[derive(Debug)]
pub struct Tensor {
    pub dimensions: Vec<u32>,
    pub ty: ElemType,
    pub data: Vec<u8>,
    pub charge: Charge,
}

/// A wasi-nn error the guest sees: a code and a (bounded) message saying what was wrong.
#[derive(Debug)]
pub struct NnError {
    pub code: Code,
    pub message: String,
    pub charge: Charge,
}

/// Splits a graph name's output type off: `<graph>@f16`, `<graph>@bf16` or `<graph>@f32`
/// (the same as no suffix). The layers still run in FP32; the device narrows their output.
pub fn split_out_kind(name: &str) -> Result<(&str, WireDtype), String> {
    let Some((graph, kind)) = name.rsplit_once('@') else {
        return Ok((name, WireDtype::F32));
    };
    let kind = kind
        .parse::<WireDtype>()
        .ok()
        .filter(|k| *k != WireDtype::Int8)
        .ok_or_else(|| {
            format!(
                "graph name `{}`: output type `@{}` is not one of @f32, @f16, @bf16 (int8 is the \
                 host's quantization of an f32 output: the invocation's `quantize`)",
                quote(name),
                quote(kind)
            )
        })?;
    Ok((graph, kind))
}

/// Parses `<model>[a..b]`.
pub fn parse_graph_name(name: &str) -> Result<(&str, Range<usize>), String> {
    let bad = || format!("graph name `{}` is not `<model>[a..b]`", quote(name));
    let (model, rest) = name.split_once('[').ok_or_else(bad)?;
    let range = rest.strip_suffix(']').ok_or_else(bad)?;
    let (a, b) = range.split_once("..").ok_or_else(bad)?;
    let num = |s: &str| {
        if s.is_empty() || s.len() > 6 || !s.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            s.parse::<usize>().ok()
        }
    };
    let (a, b) = (num(a).ok_or_else(bad)?, num(b).ok_or_else(bad)?);
    if model.is_empty()
        || model.len() > 64
        || !model
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
    {
        return Err(bad());
    }
    if a >= b {
        return Err(format!(
            "graph name `{}`: empty layer range {a}..{b}",
            quote(name)
        ));
    }
    Ok((model, a..b))
}

/// Checks an input tensor against what layer `graph.range.start` takes: FP32, rank = 1 +
/// the per-sample rank, per-sample shape equal, batch >= 1, bytes = 4 x elements. Returns
/// the batch size.
pub fn check_input(
    graph: &GraphInfo,
    dimensions: &[u32],
    ty: ElemType,
    bytes: usize,
) -> Result<i64, String> {
    if ty != ElemType::Fp32 {
        return Err(format!(
            "input element type is {ty:?}; this backend takes FP32"
        ));
    }
    let expected = &graph.input_shape;
    let matches = dimensions.len() == expected.len() + 1
        && dimensions[1..]
            .iter()
            .zip(expected)
            .all(|(&d, &e)| i64::from(d) == e)
        && dimensions[0] >= 1;
    if !matches {
        let shown: Vec<u32> = dimensions.iter().take(MAX_RANK).copied().collect();
        let more = if dimensions.len() > MAX_RANK {
            ", ..."
        } else {
            ""
        };
        return Err(format!(
            "input dimensions {shown:?}{more} ({} in all); layer {} of `{}` takes (batch >= 1, {:?})",
            dimensions.len(),
            graph.range.start,
            graph.model,
            expected
        ));
    }
    let need = dimensions
        .iter()
        .try_fold(ty.size(), |acc, &d| acc.checked_mul(d as usize));
    match need {
        Some(n) if n == bytes => Ok(i64::from(dimensions[0])),
        Some(n) => Err(format!(
            "tensor data is {bytes} bytes; dimensions {dimensions:?} of FP32 need {n}"
        )),
        None => Err(format!("dimensions {dimensions:?} overflow")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn graph_names() {
        assert_eq!(parse_graph_name("resnet18[0..4]"), Ok(("resnet18", 0..4)));
        assert_eq!(
            parse_graph_name("efficientnet_lite0[3..25]"),
            Ok(("efficientnet_lite0", 3..25))
        );
        for bad in [
            "resnet18",
            "resnet18[0..4",
            "resnet18[a..4]",
            "[0..1]",
            "Res[0..1]",
            "r[-1..2]",
            "r[0..9999999]",
            "r[1 ..2]",
        ] {
            assert!(parse_graph_name(bad).is_err(), "{bad}");
        }
        assert!(
            parse_graph_name("r[3..3]")
                .expect_err("empty")
                .contains("empty layer range")
        );
        // An 8 MiB name costs a bounded message.
        let huge = format!("{}[0..1]", "a".repeat(8 << 20));
        assert!(parse_graph_name(&huge).expect_err("long").len() < 400);
    }

    fn graph() -> GraphInfo {
        GraphInfo {
            model: "m".into(),
            range: 0..2,
            input_shape: vec![3, 4, 4],
            out: WireDtype::F32,
        }
    }

    #[test]
    fn output_types_in_graph_names() {
        assert_eq!(split_out_kind("r[0..4]"), Ok(("r[0..4]", WireDtype::F32)));
        assert_eq!(
            split_out_kind("r[0..4]@f16"),
            Ok(("r[0..4]", WireDtype::F16))
        );
        assert_eq!(
            split_out_kind("r[0..4]@bf16"),
            Ok(("r[0..4]", WireDtype::Bf16))
        );
        assert_eq!(
            split_out_kind("r[0..4]@f32"),
            Ok(("r[0..4]", WireDtype::F32))
        );
        for bad in ["r[0..4]@", "r[0..4]@F16", "r[0..4]@int8"] {
            let e = split_out_kind(bad).expect_err(bad);
            assert!(e.contains("@f32, @f16, @bf16"), "{bad}: {e}");
        }
    }

    #[test]
    fn inputs_must_match_the_first_layer() {
        let g = graph();
        assert_eq!(
            check_input(&g, &[2, 3, 4, 4], ElemType::Fp32, 2 * 48 * 4),
            Ok(2)
        );
        assert!(check_input(&g, &[2, 3, 4, 4], ElemType::U8, 96).is_err());
        assert!(check_input(&g, &[0, 3, 4, 4], ElemType::Fp32, 0).is_err());
        assert!(check_input(&g, &[2, 3, 4, 5], ElemType::Fp32, 2 * 60 * 4).is_err());
        assert!(check_input(&g, &[2, 3, 4, 4], ElemType::Fp32, 10).is_err());
        let e = check_input(&g, &vec![1; 8_000_000], ElemType::Fp32, 4).expect_err("rank");
        assert!(e.len() < 300, "{}", e.len());
    }

    proptest! {
        #[test]
        fn graph_names_parse_or_fail_cleanly(name in ".{0,40}") {
            if let Ok((model, range)) = parse_graph_name(&name) {
                prop_assert!(!model.is_empty() && range.start < range.end);
            }
        }

        /// Any dimensions and byte length: a batch size whose bytes are exactly right, or an
        /// error; never a panic or an overflow.
        #[test]
        fn tensors_are_accepted_only_when_consistent(
            dims in proptest::collection::vec(any::<u32>(), 0..10),
            bytes in any::<usize>(),
        ) {
            let g = graph();
            if let Ok(n) = check_input(&g, &dims, ElemType::Fp32, bytes) {
                prop_assert!(n >= 1);
                prop_assert_eq!(bytes as u64, 4 * u64::from(dims[0]) * 48);
            }
        }
    }
}
