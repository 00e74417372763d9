//! Object keys as tenants send them: plain relative paths, checked before any store is touched.

use crate::account::text::quote;
use hapi_wire::invoke::MAX_KEY_BYTES;

/// Checks that `key` is a plain relative object key: not empty, at most [`MAX_KEY_BYTES`], not
/// absolute, no backslash, NUL, empty, `.` or `..` segment.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("empty key".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!("key is {} bytes (max {MAX_KEY_BYTES})", key.len()));
    }
    if key.starts_with('/') {
        return Err(format!("`{}` is absolute", quote(key)));
    }
    if key.contains('\\') || key.contains('\0') {
        return Err(format!("`{}` contains `\\` or NUL", quote(key)));
    }
    if key
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!(
            "`{}` has an empty, `.` or `..` segment",
            quote(key)
        ));
    }
    Ok(())
}

/// Checks a list prefix: like a key, but it may be empty or end with `/`.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() > MAX_KEY_BYTES {
        return Err(format!(
            "prefix is {} bytes (max {MAX_KEY_BYTES})",
            prefix.len()
        ));
    }
    if prefix.is_empty() {
        return Ok(());
    }
    check_key(prefix.strip_suffix('/').unwrap_or(prefix)).map_err(|e| format!("prefix: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_that_could_escape_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "a//b",
            "./a",
            "a\\b",
            "a\0",
            "a/",
        ] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        for good in [
            "a",
            "a/b.png",
            "fashion-mnist/test/0/1.png",
            "..a/b..",
            "é/ü",
        ] {
            assert!(check_key(good).is_ok(), "{good:?}");
        }
        assert!(check_key(&"a".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(check_key(&"a".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(check_prefix("").is_ok());
        assert!(check_prefix("a/b/").is_ok());
        assert!(check_prefix("a/../").is_err());
    }

    proptest! {
        /// No key that passes can name a parent or root directory, whatever its bytes.
        #[test]
        fn accepted_keys_stay_relative(key in "[a-z./\\\\\\x00]{0,12}") {
            if check_key(&key).is_ok() {
                prop_assert!(!key.starts_with('/'));
                prop_assert!(key.split('/').all(|s| !s.is_empty() && s != "." && s != ".."));
            }
            let _ = check_prefix(&key);
        }

        #[test]
        fn error_messages_are_bounded(key in ".{0,3000}") {
            if let Err(e) = check_key(&key) {
                prop_assert!(e.len() < 400, "{}", e.len());
            }
        }
    }
}
