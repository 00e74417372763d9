//! What the host holds of a host call's arguments, counted by this binary's allocator (this
//! file's one test is the only work in the process): the one copy wasmtime lifts, whatever the
//! arguments' shape, and nothing more.

mod common;

use common::{ALICE, TestHost, hostile, raw};
use hapi_tests::alloc::Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Alice's `hostile` call of `mode` with `options`: its answer, and the most bytes the process
/// held at once meanwhile over what it held before.
async fn held_by(h: &TestHost, mode: &str, options: &[(&str, &str)]) -> (Vec<u8>, usize) {
    let before = hapi_tests::alloc::start();
    let answer = raw(h
        .invoke(ALICE, "hostile", hostile(mode, options, &[]))
        .await)
    .await;
    (answer, hapi_tests::alloc::peak_since(before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_hold_no_more_of_their_arguments_than_the_guest_gave() {
    let h = TestHost::start().await;
    let refused = 1u32.to_le_bytes().to_vec();
    // `graph.load`, always refused, with 8 Mi graph builders of one byte, all the same byte:
    // 64 MiB of the guest's memory and 200 MiB of its 512 MiB of hostcall fuel. Lifted as
    // `list<list<u8>>`, they were 192 MiB of vectors and 8 Mi allocations of one byte (in 32
    // bytes each), in one poll.
    const BUILDERS: usize = 8 << 20;
    let count = BUILDERS.to_string();
    let (answer, held) = held_by(&h, "graph-bytes", &[("count", &count)]).await;
    assert_eq!(answer, refused, "graph.load's answer");
    eprintln!("graph.load with {BUILDERS} builders held {held} bytes");
    assert!(held < 16 << 20, "graph.load held {held} bytes");
    // `models.describe` of a 48 MiB name: the name lifted for the call, and no copy of it (it
    // was copied again into a private model's id before it was looked up).
    const NAME: usize = 48 << 20;
    let bytes = NAME.to_string();
    let (answer, held) = held_by(&h, "describe", &[("bytes", &bytes)]).await;
    assert_eq!(answer, refused, "describe's answer");
    eprintln!("describe of a {NAME}-byte name held {held} bytes");
    assert!(held < NAME * 3 / 2, "describe held {held} bytes");
}
