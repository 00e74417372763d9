//! Sizes ("256MiB") and durations ("30s") as operators write them: in policy files (the
//! storage tier) and on the trainer's command line (the compute tier).

use std::time::Duration;

/// Parses a byte size: an integer with an optional unit B, KB, MB, GB (powers of 1000) or
/// KiB, MiB, GiB, TiB (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 512MiB, 2GB, 4096)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1000,
        "MB" => 1000 * 1000,
        "GB" => 1000 * 1000 * 1000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use B, KB, MB, GB, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// Parses a duration: an integer with unit ms, s, m or h.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 250ms, 30s, 5m)"))?;
    let ms = match unit.trim() {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "" => return Err(format!("`{text}` needs a unit (ms, s, m or h)")),
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use ms, s, m or h)"
            ));
        }
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

/// A byte size as an operator would write it (`256MiB`, `1536KiB`, `100B`).
pub fn format_size(n: u64) -> String {
    for (unit, size) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn sizes_and_durations_parse_or_fail_cleanly(text in ".{0,40}") {
            let _ = parse_size(&text);
            let _ = parse_duration(&text);
        }

        #[test]
        fn formatted_sizes_parse_back(n in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(n)), Ok(n));
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert!(
            parse_size("12XB")
                .expect_err("unit")
                .contains("unknown unit `XB`")
        );
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert!(
            parse_duration("30")
                .expect_err("unit")
                .contains("needs a unit")
        );
        assert!(parse_duration("3d").is_err());
    }
}
