//! The body of `POST /v1/invoke/{function}`.
//!
//! Every field a client controls has a named bound, checked by [`InvokeRequest::check`] before
//! the host allocates anything sized by it. The lists and maps are checked while they are
//! parsed too (`keys`, `options`), so that a body never becomes more than the bounds allow on
//! its way to that check.

use serde::de::{Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Largest invoke body: 4,096 keys of a few hundred bytes each fit easily; anything larger is
/// not an invocation.
pub const MAX_INVOKE_BODY: usize = 4 << 20;
/// Most keys in one invocation.
pub const MAX_KEYS: usize = 4096;
/// Longest object key (S3's limit).
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest bucket or model name.
pub const MAX_NAME_BYTES: usize = 64;
/// Most function options.
pub const MAX_OPTIONS: usize = 64;
/// Longest option name or value.
pub const MAX_OPTION_BYTES: usize = 4096;

/// Longest string an invoke body may hold, as sent: an option value's bound with every byte
/// escaped (`\u00XX`, six bytes each). Checked before the body is parsed ([`check_strings`]).
pub const MAX_JSON_STRING: usize = 6 * MAX_OPTION_BYTES;

/// Refuses a JSON body holding a string (a value or a field name) longer than `max` bytes as
/// sent, saying where it starts; nothing else is looked at, and nothing allocated. serde's
/// errors quote a string of the wrong type, an unknown field or an unknown variant whole, and
/// Debug-escaped (a two-byte character becomes the six of `\u{80}`), so a body of one 4 MiB
/// string became messages of some 38 MB, on no tenant's account, before anything was bounded.
pub fn check_strings(body: &[u8], max: usize) -> Result<(), String> {
    let mut at = 0;
    while let Some(open) = memchr_quote(body, at) {
        let mut i = open + 1;
        loop {
            match body.get(i) {
                // Unterminated: serde's error to give.
                None => return Ok(()),
                Some(b'\\') => i += 2,
                Some(b'"') => break,
                Some(_) => i += 1,
            }
        }
        let len = i - open - 1;
        if len > max {
            return Err(format!(
                "a string of {len} bytes at byte {open}; none may be longer than {max}"
            ));
        }
        at = i + 1;
    }
    Ok(())
}

/// The first `"` at or after `from`.
fn memchr_quote(body: &[u8], from: usize) -> Option<usize> {
    body.get(from..)?
        .iter()
        .position(|&b| b == b'"')
        .map(|i| from + i)
}

/// One invocation: run the function on `keys` of `bucket`, with layers [0, `split`) of `model`.
///
/// `model` and `split` are optional: a function that uses no model takes neither, and
/// `feature-extract` runs up to the model's freeze index when `split` is absent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    pub bucket: String,
    #[serde(deserialize_with = "keys")]
    pub keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "layer_index"
    )]
    pub split: Option<u32>,
    /// Function-specific options (a function rejects those it does not know).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "options"
    )]
    pub options: BTreeMap<String, String>,
    /// `"int8"`: the host sends the function's f32 output as int8 with per-channel scales
    /// ([`crate::quantize`]); absent, as the function returned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<Quantize>,
}

/// What the host may turn a function's output into before sending it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quantize {
    Int8,
}

/// `keys`, read one at a time and refused at the first past [`MAX_KEYS`] or longer than
/// [`MAX_KEY_BYTES`], so that parsing holds no more than the bounds allow, whatever the body
/// holds: a 4 MiB body of one-letter keys would otherwise become a million allocations before
/// their count is looked at.
fn keys<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX_KEYS} keys")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut keys = Vec::new();
            while let Some(k) = seq.next_element::<String>()? {
                if keys.len() == MAX_KEYS {
                    return Err(A::Error::custom(format!(
                        "more than {MAX_KEYS} keys; at most {MAX_KEYS} per invocation"
                    )));
                }
                if k.len() > MAX_KEY_BYTES {
                    return Err(A::Error::custom(format!(
                        "key {} is {} bytes; at most {MAX_KEY_BYTES}",
                        keys.len(),
                        k.len()
                    )));
                }
                keys.push(k);
            }
            Ok(keys)
        }
    }
    d.deserialize_seq(Keys)
}

/// `options`, bounded as they are parsed (count, and each name's and value's length).
fn options<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Options;
    impl<'de> Visitor<'de> for Options {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a map of at most {MAX_OPTIONS} options")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = map.next_entry::<String, String>()? {
                if k.len() > MAX_OPTION_BYTES || v.len() > MAX_OPTION_BYTES {
                    let k: String = k.chars().take(64).collect();
                    return Err(A::Error::custom(format!(
                        "option `{k}`: names and values are at most {MAX_OPTION_BYTES} bytes"
                    )));
                }
                out.insert(k, v);
                if out.len() > MAX_OPTIONS {
                    return Err(A::Error::custom(format!(
                        "more than {MAX_OPTIONS} options; at most {MAX_OPTIONS}"
                    )));
                }
            }
            Ok(out)
        }
    }
    d.deserialize_map(Options)
}

/// `split`, with an error that names it (serde's own would only say "expected u32").
fn layer_index<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let v = Option::<serde_json::Number>::deserialize(d)?;
    v.map(|n| {
        n.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "split {n}: must be a layer index, 0..={}",
                    u32::MAX
                ))
            })
    })
    .transpose()
}

impl InvokeRequest {
    /// Parses and checks a request body.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        if body.len() > MAX_INVOKE_BODY {
            return Err(format!(
                "the body is {} bytes; an invocation is at most {MAX_INVOKE_BODY}",
                body.len()
            ));
        }
        check_strings(body, MAX_JSON_STRING).map_err(|e| format!("request body: {e}"))?;
        let req: Self = serde_json::from_slice(body).map_err(|e| format!("request body: {e}"))?;
        req.check()?;
        Ok(req)
    }

    /// Checks every field against its bound.
    pub fn check(&self) -> Result<(), String> {
        if self.keys.len() > MAX_KEYS {
            return Err(format!(
                "{} keys; at most {MAX_KEYS} per invocation",
                self.keys.len()
            ));
        }
        if let Some((i, k)) = self
            .keys
            .iter()
            .enumerate()
            .find(|(_, k)| k.len() > MAX_KEY_BYTES)
        {
            return Err(format!(
                "key {i} is {} bytes; at most {MAX_KEY_BYTES}",
                k.len()
            ));
        }
        let model = self.model.as_deref().unwrap_or_default();
        for (what, v) in [("bucket", self.bucket.as_str()), ("model", model)] {
            if v.len() > MAX_NAME_BYTES {
                return Err(format!(
                    "{what} is {} bytes; at most {MAX_NAME_BYTES}",
                    v.len()
                ));
            }
        }
        if self.options.len() > MAX_OPTIONS {
            return Err(format!(
                "{} options; at most {MAX_OPTIONS}",
                self.options.len()
            ));
        }
        if let Some((k, _)) = self
            .options
            .iter()
            .find(|(k, v)| k.len() > MAX_OPTION_BYTES || v.len() > MAX_OPTION_BYTES)
        {
            let k: String = k.chars().take(64).collect();
            return Err(format!(
                "option `{k}`: names and values are at most {MAX_OPTION_BYTES} bytes"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_request_round_trips_and_unknown_fields_are_refused() {
        let r = InvokeRequest {
            bucket: "datasets".into(),
            keys: vec!["a/b.png".into()],
            model: Some("resnet18".into()),
            split: Some(3),
            options: BTreeMap::new(),
            quantize: None,
        };
        let json = serde_json::to_vec(&r).expect("json");
        assert_eq!(InvokeRequest::parse(&json).expect("parse"), r);
        let e =
            InvokeRequest::parse(br#"{"bucket":"b","keys":[],"model":"m","split":1,"batch":4}"#)
                .expect_err("unknown field");
        assert!(e.contains("unknown field `batch`"), "{e}");
    }

    #[test]
    fn model_and_split_are_optional() {
        let r = InvokeRequest::parse(br#"{"bucket":"b","keys":["k"]}"#).expect("parse");
        assert_eq!((r.model, r.split), (None, None));
        let r = InvokeRequest::parse(br#"{"bucket":"b","keys":["k"],"model":"m"}"#).expect("parse");
        assert_eq!((r.model.as_deref(), r.split), (Some("m"), None));
        let json = serde_json::to_string(
            &InvokeRequest::parse(br#"{"bucket":"b","keys":[]}"#).expect("parse"),
        )
        .expect("json");
        assert_eq!(json, r#"{"bucket":"b","keys":[]}"#);
        let e =
            InvokeRequest::parse(br#"{"bucket":"b","keys":[],"split":-1}"#).expect_err("negative");
        assert!(e.contains("split"), "{e}");
    }

    #[test]
    fn every_bound_is_obeyed_and_violated() {
        let ok = |f: &dyn Fn(&mut InvokeRequest)| {
            let mut r = InvokeRequest {
                bucket: "b".into(),
                keys: vec![],
                model: Some("m".into()),
                split: Some(0),
                options: BTreeMap::new(),
                quantize: None,
            };
            f(&mut r);
            r.check()
        };
        assert!(ok(&|r| r.keys = vec!["k".into(); MAX_KEYS]).is_ok());
        assert!(ok(&|r| r.keys = vec!["k".into(); MAX_KEYS + 1]).is_err());
        assert!(ok(&|r| r.keys = vec!["k".repeat(MAX_KEY_BYTES)]).is_ok());
        assert!(ok(&|r| r.keys = vec!["k".repeat(MAX_KEY_BYTES + 1)]).is_err());
        assert!(ok(&|r| r.bucket = "b".repeat(MAX_NAME_BYTES)).is_ok());
        assert!(ok(&|r| r.bucket = "b".repeat(MAX_NAME_BYTES + 1)).is_err());
        assert!(ok(&|r| r.model = Some("m".repeat(MAX_NAME_BYTES + 1))).is_err());
        assert!(
            ok(&|r| r.options = (0..MAX_OPTIONS)
                .map(|i| (i.to_string(), "v".into()))
                .collect())
            .is_ok()
        );
        assert!(
            ok(&|r| r.options = (0..=MAX_OPTIONS)
                .map(|i| (i.to_string(), "v".into()))
                .collect())
            .is_err()
        );
        assert!(
            ok(&|r| {
                r.options
                    .insert("k".into(), "v".repeat(MAX_OPTION_BYTES + 1));
            })
            .is_err()
        );
        // The same bounds while parsing, with errors that say which.
        let parse = |keys: Vec<String>| {
            let body = serde_json::json!({"bucket": "b", "keys": keys});
            InvokeRequest::parse(&serde_json::to_vec(&body).expect("json"))
        };
        assert!(parse(vec!["k".into(); MAX_KEYS]).is_ok());
        let e = parse(vec!["k".into(); MAX_KEYS + 1]).expect_err("too many");
        assert!(
            e.contains("more than 4096 keys; at most 4096 per invocation"),
            "{e}"
        );
        let e = parse(vec!["k".into(), "k".repeat(MAX_KEY_BYTES + 1)]).expect_err("too long");
        assert!(e.contains("key 1 is 1025 bytes; at most 1024"), "{e}");
        let big = vec![b' '; MAX_INVOKE_BODY + 1];
        assert!(
            InvokeRequest::parse(&big)
                .expect_err("big")
                .contains("at most")
        );
    }

    proptest! {
        /// Whatever bytes arrive, parsing gives a request within bounds or an error; it never
        /// panics.
        #[test]
        fn arbitrary_bodies_parse_or_fail_cleanly(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(r) = InvokeRequest::parse(&body) {
                prop_assert!(r.check().is_ok());
            }
        }

        /// JSON-shaped bodies with fields of any size and content.
        #[test]
        fn json_bodies_parse_or_fail_cleanly(
            bucket in ".{0,80}",
            keys in proptest::collection::vec(".{0,40}", 0..8),
            model in ".{0,80}",
            split in any::<i64>(),
            extra in proptest::option::of("[a-z]{1,8}"),
        ) {
            let mut v = serde_json::json!({"bucket": bucket, "keys": keys, "model": model, "split": split});
            if let Some(k) = extra {
                v[k] = serde_json::json!(1);
            }
            let body = serde_json::to_vec(&v).expect("json");
            match InvokeRequest::parse(&body) {
                Ok(r) => {
                    prop_assert!(r.bucket.len() <= MAX_NAME_BYTES);
                    prop_assert_eq!(r.split, u32::try_from(split).ok());
                }
                Err(e) => prop_assert!(!e.is_empty()),
            }
        }
    }
}
