//! What parsing an invoke body allocates, counted by this binary's allocator: a body of many
//! tiny keys or options is refused at the first past its bound, holding no more than the
//! bounds allow on the way, not an allocation per entry of the whole body.

use hapi_tests::alloc::{Counting, peak_during};
use hapi_wire::InvokeRequest;
use hapi_wire::invoke::{MAX_INVOKE_BODY, MAX_KEYS, MAX_OPTIONS, check_strings};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The allocator counts every thread's allocations: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A body of at most `MAX_INVOKE_BODY` bytes: `entry` repeated (its `{i}` replaced by the
/// entry's index in hex) between `head` and `tail`.
fn body(head: &str, entry: &str, tail: &str) -> Vec<u8> {
    let mut b = head.as_bytes().to_vec();
    for i in 0.. {
        let e = entry.replace("{i}", &format!("{i:x}"));
        if b.len() + e.len() + 1 > MAX_INVOKE_BODY - tail.len() {
            break;
        }
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(e.as_bytes());
    }
    b.extend_from_slice(tail.as_bytes());
    assert!(b.len() <= MAX_INVOKE_BODY);
    b
}

#[test]
fn a_body_of_tiny_entries_is_refused_holding_no_more_than_the_bounds() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // About 1,000,000 keys of one byte, and about 370,000 options of a few bytes.
    let keys = body(r#"{"bucket":"b","keys":["#, r#""a""#, "]}");
    let options = body(
        r#"{"bucket":"b","keys":[],"options":{"#,
        r#""{i}":"v""#,
        "}}",
    );
    for (what, b, needle, max) in [
        ("keys", &keys, "more than 4096 keys", MAX_KEYS),
        ("options", &options, "more than 64 options", MAX_OPTIONS),
    ] {
        let (parsed, peak) = peak_during(|| InvokeRequest::parse(b));
        eprintln!(
            "{what}: {peak} bytes held at once parsing a {} byte body",
            b.len()
        );
        let e = parsed.expect_err(what);
        assert!(e.contains(needle), "{what}: {e}");
        // What the bounds allow: `max` entries of a few dozen bytes each, far below the body.
        assert!(
            peak < 1 << 20,
            "{what}: {peak} bytes held at once parsing a {} byte body (bound {max})",
            b.len()
        );
    }
}

#[test]
fn a_long_string_is_refused_before_any_message_quotes_it() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // One string of two-byte characters filling the body, where serde's error would quote it
    // whole and Debug-escaped: as the list of keys, the split, a field's name, the quantize.
    let big = "\u{80}".repeat((MAX_INVOKE_BODY - 100) / 2);
    for (what, b) in [
        ("keys", format!(r#"{{"bucket":"b","keys":"{big}"}}"#)),
        (
            "split",
            format!(r#"{{"bucket":"b","keys":[],"split":"{big}"}}"#),
        ),
        (
            "a field",
            format!(r#"{{"bucket":"b","keys":[],"{big}":1}}"#),
        ),
        (
            "quantize",
            format!(r#"{{"bucket":"b","keys":[],"quantize":"{big}"}}"#),
        ),
    ] {
        let (parsed, peak) = peak_during(|| InvokeRequest::parse(b.as_bytes()));
        eprintln!(
            "{what}: {peak} bytes held at once parsing a {} byte body",
            b.len()
        );
        let e = parsed.expect_err(what);
        assert!(e.contains("none may be longer than 24576"), "{what}: {e}");
        assert!(peak < 1 << 20, "{what}: {peak} bytes held at once");
    }
    // Escapes count as sent; the longest option value, every byte escaped, passes.
    let escaped = "\\u0041".repeat(4096);
    assert_eq!(
        check_strings(format!(r#"{{"k":"{escaped}"}}"#).as_bytes(), 6 * 4096),
        Ok(())
    );
    assert!(check_strings(format!(r#"{{"k":"{escaped}a"}}"#).as_bytes(), 6 * 4096).is_err());
    // An escaped quote does not end a string; an unterminated one is serde's to report.
    assert!(check_strings(br#"{"k":"a\"bc"}"#, 4).is_err());
    assert_eq!(check_strings(br#"{"k":"a\"b"}"#, 4), Ok(()));
    assert_eq!(check_strings(br#"{"k":"abcdefgh"#, 4), Ok(()));
}
