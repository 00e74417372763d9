//! The contract does not drift: the vendored wasi-nn WIT is the pinned release, byte for byte.

use sha2::Digest;

/// sha256 of `wit/wasi-nn.wit` in wasmtime-wasi-nn 48.0.8 (`wasi:nn@0.2.0-rc-2024-10-28`).
const PINNED_WASI_NN: &str = "362c214e8192a7b4754575c6c22813409323690d089742504e661f3e5f5d2fe2";

#[test]
fn vendored_wasi_nn_is_the_pinned_version() {
    let path = hapi_tests::workspace().join("wit/deps/wasi-nn/wasi-nn.wit");
    let path = path.display();
    let text = std::fs::read(path.to_string()).expect("vendored wasi-nn WIT");
    let digest: String = sha2::Sha256::digest(&text)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        digest, PINNED_WASI_NN,
        "{path} changed; re-vendor the pinned release instead of editing it"
    );
    assert!(String::from_utf8_lossy(&text).starts_with("package wasi:nn@0.2.0-rc-2024-10-28;"));
}

#[test]
fn pushdown_world_imports_the_pinned_wasi_nn() {
    let text = std::fs::read_to_string(hapi_tests::workspace().join("wit/pushdown.wit"))
        .expect("pushdown.wit");
    // The version the host checks components against is the file's.
    let version = hapi_host::wasm::compile::WORLD_VERSION;
    assert!(text.starts_with(&format!("package hapi:pushdown@{version};")));
    for iface in ["tensor", "graph", "inference", "errors"] {
        assert!(
            text.contains(&format!("import wasi:nn/{iface}@0.2.0-rc-2024-10-28;")),
            "{iface}"
        );
    }
}
