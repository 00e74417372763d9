//! The memory model's measurement instrument, alone in its process: the resident set's peak
//! follows allocation under exact accounting (no other test allocates or frees meanwhile).

use hapi_host::memory::rss;

#[test]
fn peaks_are_measurable_here() {
    assert!(rss::available(), "/proc/self/status and clear_refs");
    rss::exact(|| {
        for _ in 0..3 {
            // Freed and allocated again: each time the resident set grows by the block.
            rss::reset_peak();
            let base = rss::current();
            let v = vec![1u8; 8 << 20];
            let grown = rss::peak().saturating_sub(base);
            drop(v);
            assert!(grown >= 7 << 20, "peak grew {grown} bytes for 8 MiB");
        }
    });
}
