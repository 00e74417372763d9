//! Text that a guest or client supplied and the host quotes or keeps: bounded, so that an
//! 8 MiB graph name or a 24 MiB error message costs the host a few hundred bytes.

/// Bytes of a guest- or client-supplied string quoted inside a host message.
pub const MAX_QUOTE: usize = 160;
/// Longest message the host keeps or sends (a guest's error text included).
pub const MAX_MESSAGE: usize = 4096;

/// A caught panic's message.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)")
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` for quoting in a message: control and unusual characters escaped, at most [`MAX_QUOTE`]
/// bytes of that escaped text (an escape such as `\u{e000}` is several bytes for one
/// character, so the escaped text, not `s`, is what is bounded), and how much was cut.
pub fn quote(s: &str) -> String {
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let escaped = c.escape_debug();
        let n: usize = escaped.clone().map(char::len_utf8).sum();
        if out.len() + n > MAX_QUOTE {
            break;
        }
        out.extend(escaped);
        used += c.len_utf8();
    }
    if used < s.len() {
        out.push_str(&format!("... ({} bytes in all)", s.len()));
    }
    out
}

/// `value`'s text (`{:#}`, so an error's chain), formatting only up to [`MAX_MESSAGE`] bytes:
/// the formatting stops there, so a value whose whole text would be huge (a trap's backtrace)
/// costs the host no more than its first bytes.
pub fn bounded_display(value: &dyn std::fmt::Display) -> String {
    struct Capped(String);
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = (MAX_MESSAGE - 40).saturating_sub(self.0.len());
            if s.len() > room {
                self.0.push_str(prefix(s, room));
                return Err(std::fmt::Error);
            }
            self.0.push_str(s);
            Ok(())
        }
    }
    let mut out = Capped(String::new());
    if std::fmt::Write::write_fmt(&mut out, format_args!("{value:#}")).is_err() {
        out.0.push_str("... (cut)");
    }
    out.0
}

/// `s` cut to at most [`MAX_MESSAGE`] bytes, saying how much was cut.
pub fn bounded(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let all = s.len();
        let keep = prefix(&s, MAX_MESSAGE - 40).len();
        s.truncate(keep);
        s.shrink_to_fit();
        s.push_str(&format!("... ({all} bytes in all)"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        assert_eq!(quote("resnet18[0..1]"), "resnet18[0..1]");
        let q = quote(&"é".repeat(10_000));
        assert!(q.len() < MAX_QUOTE + 40, "{}", q.len());
        assert!(q.ends_with("(20000 bytes in all)"), "{q}");
        assert_eq!(quote("a\nb"), "a\\nb");
        // Escapes are bounded too: each of these is 8 bytes escaped for 3 of text.
        let q = quote(&"\u{e000}".repeat(100));
        assert!(q.len() < MAX_QUOTE + 40, "{}", q.len());
        assert!(q.ends_with("(300 bytes in all)"), "{q}");
        let b = bounded("x".repeat(24 << 20));
        assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
        assert!(b.ends_with(&format!("({} bytes in all)", 24 << 20)));
        assert_eq!(bounded("short".into()), "short");
        // Formatting stops at the bound: a Display that would write forever ends.
        struct Endless;
        impl std::fmt::Display for Endless {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                loop {
                    f.write_str("again ")?;
                }
            }
        }
        let d = bounded_display(&Endless);
        assert!(
            d.len() <= MAX_MESSAGE && d.ends_with("... (cut)"),
            "{}",
            d.len()
        );
        assert_eq!(bounded_display(&"short"), "short");
    }
}
