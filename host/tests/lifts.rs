//! What the host holds on a tenant's behalf, counted by this binary's allocator (the tests run
//! one at a time, each the only work in the process): of a host call's arguments, the one copy
//! wasmtime lifts, whatever the arguments' shape, and nothing more; of a listing, no more than
//! its tenant is charged.

mod common;

use common::{ALICE, TestHost, hostile, raw};
use hapi_tests::alloc::Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The tests one at a time: the allocator's counts are the process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _one = ONE_AT_A_TIME.lock().await;
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

/// A listing's kept entries are charged as the host holds them: their strings' heap blocks
/// and the vector they are kept in, which doubles as it grows. They were charged as the
/// guest's copy takes them (the strings and 40 bytes), about a third of what 10,000 entries
/// of short keys held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listings_entries_are_charged_as_the_host_holds_them() {
    use hapi_host::account::Account;
    use hapi_host::store::ObjectMeta;
    use hapi_host::store::error::Smallest;
    let _one = ONE_AT_A_TIME.lock().await;
    const ENTRIES: usize = 10_000;
    let account = Account::new(1 << 30);
    let before = hapi_tests::alloc::start();
    let mut kept = Smallest::new(ENTRIES, Some(&account));
    // Keys of a few bytes, each with an etag: what a store of small objects lists.
    for i in 0..ENTRIES {
        kept.push(ObjectMeta {
            key: format!("k{i}"),
            size: 1,
            last_modified_ms: 0,
            etag: Some(format!("{i:x}")),
        })
        .expect("within the limit");
    }
    let held = hapi_tests::alloc::peak_since(before);
    let charged = account.peak() as usize;
    eprintln!("{ENTRIES} entries held at most {held} bytes, charged at most {charged}");
    // One entry is made before it is pushed and charged.
    assert!(held <= charged + 64, "held {held} bytes, charged {charged}");
    let sorted = kept.into_sorted();
    assert_eq!(sorted.len(), ENTRIES);
    assert_eq!(account.used(), 0, "released with the listing");
}
