//! What reading a request body holds, counted by this binary's allocator (this file's one test
//! is the only work in the process): a body sent as many tiny chunks holds what the same body
//! sent whole holds, not a buffer and a handle per chunk.

mod common;

use common::{ALICE, TestHost};
use hapi_tests::alloc::Counting;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Uploads `size` bytes that are not Wasm as function `junk`, whole (`Content-Length`) or in
/// chunks of one byte, on a fresh connection: the status, and the most bytes the process held
/// at once meanwhile over what it held before (the request's bytes, built before, excluded).
async fn upload(h: &TestHost, size: usize, chunked: bool) -> (u16, usize) {
    let addr = h.url.trim_start_matches("http://").to_string();
    let head = |framing: String| {
        format!(
            "PUT /v1/functions/junk HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\n\
             Content-Type: application/wasm\r\n{framing}\r\n\r\n"
        )
    };
    let mut request = Vec::new();
    if chunked {
        request.extend_from_slice(head("Transfer-Encoding: chunked".into()).as_bytes());
        for _ in 0..size {
            request.extend_from_slice(b"1\r\nX\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
    } else {
        request.extend_from_slice(head(format!("Content-Length: {size}")).as_bytes());
        request.extend(std::iter::repeat_n(b'X', size));
    }
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let before = hapi_tests::alloc::start();
    conn.write_all(&request).await.expect("send");
    let mut answer = vec![0u8; 4096];
    let n = conn.read(&mut answer).await.expect("answer");
    let peak = hapi_tests::alloc::peak_since(before);
    let text = String::from_utf8_lossy(&answer[..n]);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    assert!(text.contains("not WebAssembly"), "{text}");
    (status, peak)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_one_byte_chunks_holds_what_the_whole_body_holds() {
    let h = TestHost::start().await;
    const SIZE: usize = 1 << 20;
    let (status, whole) = upload(&h, SIZE, false).await;
    assert_eq!(status, 422);
    let (status, chunks) = upload(&h, SIZE, true).await;
    assert_eq!(status, 422);
    eprintln!(
        "a {SIZE}-byte body held {whole} bytes at most sent whole, {chunks} in 1-byte chunks"
    );
    // Whole, the body's buffer (its declared length) and the connection's read buffer; in
    // chunks, a buffer grown by doubling. Collected frame by frame, 1-byte chunks held 51x
    // the body (53,538,588 bytes for 1 MiB).
    assert!(whole < 2 * SIZE, "{whole} bytes sent whole");
    assert!(chunks < 4 * SIZE, "{chunks} bytes in 1-byte chunks");
}
