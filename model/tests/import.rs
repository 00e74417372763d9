//! `hapi-model import`: a Python `module:function`, a TorchScript file and an ONNX file become
//! packages with automatic layering (a residual block is one layer), declared preprocessing and
//! a passing chained-vs-whole check; bad input gets a clear error.

use hapi_model::{Manifest, ModelPackage};
use std::path::Path;
use std::process::{Command, Output};

/// This package's directory: the run-time value first (clones sharing a build directory may
/// share this test binary, and the path compiled into it may be another clone's).
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        std::path::PathBuf::from,
    )
}

fn python() -> String {
    std::env::var("HAPI_PYTHON").expect(
        "HAPI_PYTHON is not set: run the tests through `cargo xtask test`, or `source <(cargo xtask env)` first",
    )
}

/// `hapi-model <args>` in `dir`, where `tinynets.py` is importable.
fn hapi_model(dir: &Path, args: &[&str]) -> Output {
    Command::new(hapi_tests::package_binary(
        "hapi-model",
        env!("CARGO_BIN_EXE_hapi-model"),
    ))
    .args(args)
    .current_dir(dir)
    .env("HAPI_PYTHON", python())
    .env("HAPI_DEVICE", "cpu")
    .output()
    .expect("running hapi-model")
}

fn ok(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

fn failed(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "expected a failure:\n{text}");
    text
}

/// A temporary directory holding `tinynets.py`, a TorchScript file and an ONNX file made from
/// it.
fn sources() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        package_dir().join("tests/tinynets.py"),
        dir.path().join("tinynets.py"),
    )
    .expect("copy tinynets.py");
    let status = Command::new(python())
        .args([
            "-W",
            "ignore",
            "-c",
            "import tinynets; tinynets.save_torchscript('tiny.pt'); tinynets.save_onnx_nhwc('tiny.onnx', 32)",
        ])
        .current_dir(dir.path())
        .status()
        .expect("python");
    assert!(status.success());
    dir
}

fn names(m: &Manifest) -> Vec<&str> {
    m.layers.iter().map(|l| l.name.as_str()).collect()
}

#[test]
fn a_function_a_torchscript_file_and_an_onnx_file_become_checked_packages() {
    let dir = sources();
    let d = dir.path();
    let small = ["--size", "40", "--crop", "32", "--out", "models"];

    let text = ok(&hapi_model(
        d,
        &[
            &["import", "tinynets:tiny", "--name", "tiny_py"],
            &small[..],
        ]
        .concat(),
    ));
    assert!(text.contains("tiny_py") && text.contains("ok"), "{text}");
    let m = Manifest::load(&d.join("models/tiny_py")).expect("manifest");
    // Each residual block is one layer; the classifier is the one trained layer.
    assert_eq!(
        names(&m),
        ["stem", "act", "block1", "block2", "pool", "flatten", "fc"]
    );
    assert_eq!(m.freeze_index, 6);
    assert_eq!(m.input.shape, [3, 32, 32]);

    ok(&hapi_model(
        d,
        &[&["import", "tiny.pt", "--name", "tiny_ts"], &small[..]].concat(),
    ));
    let ts = Manifest::load(&d.join("models/tiny_ts")).expect("manifest");
    assert_eq!(names(&ts), names(&m), "TorchScript: its children, in order");

    ok(&hapi_model(
        d,
        &[
            &[
                "import",
                "tiny.onnx",
                "--name",
                "tiny_onnx",
                "--layout",
                "nhwc",
                "--channel-order",
                "bgr",
                "--scale",
                "255",
                "--mean",
                "103.9,116.8,123.7",
                "--std",
                "1,1,1",
                "--resize",
                "squash",
                "--interpolation",
                "bicubic",
            ],
            &small[..],
        ]
        .concat(),
    ));
    let onnx = Manifest::load(&d.join("models/tiny_onnx")).expect("manifest");
    let i = &onnx.input;
    assert_eq!(i.shape, [32, 32, 3]);
    assert_eq!(
        (
            i.layout.as_str(),
            i.channel_order.as_str(),
            i.scale,
            i.resize_mode.as_str(),
            i.interpolation.as_str()
        ),
        ("nhwc", "bgr", 255.0, "squash", "bicubic")
    );
    // The model's own transpose is its first layer; the preprocessing is declared, not added.
    assert_eq!(onnx.layers.len(), 8, "{:?}", names(&onnx));
    assert_eq!(onnx.layers[0].input_shape, [32, 32, 3]);
    assert_eq!(onnx.layers[0].output_shape, [3, 32, 32]);
    assert_eq!(onnx.freeze_index, 7);

    // check and info take package paths; the packages load and chain in Rust.
    let text = ok(&hapi_model(
        d,
        &[
            "check",
            "models/tiny_py",
            "models/tiny_ts",
            "models/tiny_onnx",
        ],
    ));
    assert_eq!(text.matches(" ok").count(), 3, "{text}");
    let text = ok(&hapi_model(d, &["info", "models/tiny_onnx"]));
    assert!(text.contains("nhwc") && text.contains("bgr"), "{text}");
    let pkg = ModelPackage::load(&d.join("models/tiny_onnx"), tch::Device::Cpu).expect("load");
    let x = tch::Tensor::rand([2, 32, 32, 3], (tch::Kind::Float, tch::Device::Cpu));
    assert_eq!(pkg.run(0..8, &x).expect("run").size(), [2, 5]);

    // Merging down to four layers; cut points that do not exist are named with the valid ones.
    ok(&hapi_model(
        d,
        &[
            &[
                "import",
                "tinynets:tiny",
                "--name",
                "tiny4",
                "--max-layers",
                "4",
            ],
            &small[..],
        ]
        .concat(),
    ));
    assert_eq!(
        Manifest::load(&d.join("models/tiny4"))
            .expect("manifest")
            .layers
            .len(),
        4
    );
    let text = failed(&hapi_model(
        d,
        &[
            &[
                "import",
                "tinynets:tiny",
                "--name",
                "tiny_cut",
                "--cut-at",
                "conv1",
            ],
            &small[..],
        ]
        .concat(),
    ));
    assert!(
        text.contains("not cut points") && text.contains("block1"),
        "{text}"
    );
}

#[test]
fn bad_sources_and_names_are_named_in_the_error() {
    let dir = sources();
    let d = dir.path();
    let small = ["--size", "40", "--crop", "32", "--out", "models"];
    for (source, name, needle) in [
        ("missing.onnx", "m", "no such file"),
        ("tinynets:nothing", "m", "has no `nothing`"),
        ("nomodule:f", "m", "cannot import `nomodule`"),
        ("tinynets.py", "m", "expected a .pt/.pth TorchScript file"),
        ("tinynets:tiny", "Bad-Name", "lowercase letters"),
    ] {
        let text = failed(&hapi_model(
            d,
            &[&["import", source, "--name", name], &small[..]].concat(),
        ));
        assert!(text.contains(needle), "{source}: {text}");
    }
    // The wrong input layout for the model: said before anything is written.
    let text = failed(&hapi_model(
        d,
        &[
            &["import", "tinynets:tiny", "--name", "m", "--layout", "nhwc"],
            &small[..],
        ]
        .concat(),
    ));
    assert!(text.contains("does not run on a"), "{text}");
    ok(&hapi_model(
        d,
        &[&["import", "tinynets:tiny", "--name", "twice"], &small[..]].concat(),
    ));
    let text = failed(&hapi_model(
        d,
        &[&["import", "tinynets:tiny", "--name", "twice"], &small[..]].concat(),
    ));
    assert!(
        text.contains("exists") && text.contains("--force"),
        "{text}"
    );
}

/// Every package this checkout has (the exporter's) and the importer's follow the schema that
/// docs/model-package.md documents.
#[test]
fn every_manifest_follows_the_schema() {
    let dir = sources();
    let d = dir.path();
    ok(&hapi_model(
        d,
        &[
            "import",
            "tinynets:tiny",
            "--name",
            "tiny_py",
            "--size",
            "40",
            "--crop",
            "32",
            "--out",
            "models",
        ],
    ));
    let mut manifests: Vec<std::path::PathBuf> =
        hapi_model::list_packages(&hapi_model::models_dir())
            .expect("packages (run `cargo xtask setup`)")
            .into_iter()
            .map(|p| p.join("manifest.json"))
            .collect();
    assert!(manifests.len() >= 7, "{manifests:?}");
    manifests.push(d.join("models/tiny_py/manifest.json"));
    let schema = package_dir().join("manifest.schema.json");
    let script = "import json, sys, jsonschema\n\
        schema = json.load(open(sys.argv[1]))\n\
        jsonschema.Draft202012Validator.check_schema(schema)\n\
        for p in sys.argv[2:]:\n    jsonschema.validate(json.load(open(p)), schema)\n\
        print(len(sys.argv) - 2, 'valid')\n";
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(&schema)
        .args(&manifests)
        .output()
        .expect("python");
    let text = ok(&out);
    assert!(
        text.contains(&format!("{} valid", manifests.len())),
        "{text}"
    );

    // A manifest the schema refuses: an unknown layout.
    let bad = d.join("bad.json");
    let mut m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.join("models/tiny_py/manifest.json")).expect("manifest"),
    )
    .expect("json");
    m["input"]["layout"] = "chwn".into();
    std::fs::write(&bad, m.to_string()).expect("write");
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(&schema)
        .arg(&bad)
        .output()
        .expect("python");
    failed(&out);
}
