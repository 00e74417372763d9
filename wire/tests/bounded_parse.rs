//! What parsing an invoke body allocates, counted by this binary's allocator: a body of many
//! tiny keys or options is refused at the first past its bound, holding no more than the
//! bounds allow on the way, not an allocation per entry of the whole body.

use hapi_tests::alloc::{Counting, peak_during};
use hapi_wire::InvokeRequest;
use hapi_wire::invoke::{MAX_INVOKE_BODY, MAX_KEYS, MAX_OPTIONS};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
