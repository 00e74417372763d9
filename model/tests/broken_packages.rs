//! Broken model packages give errors that name the file or the mismatch; nothing panics.
//!
//! Each case copies the manifest of a real package into a temporary directory, links the real
//! segment files beside it, and breaks one thing.

use hapi_model::{ModelError, ModelPackage, models_dir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

const SOURCE: &str = "efficientnet_lite0";

/// A temporary copy of the package whose manifest `edit` may change.
fn package(edit: impl FnOnce(&mut Value)) -> (tempfile::TempDir, PathBuf) {
    let src = models_dir().join(SOURCE);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join(SOURCE);
    std::fs::create_dir(&dir).expect("mkdir");
    for entry in std::fs::read_dir(&src).expect("package dir (run `cargo xtask setup`)") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name");
        if name != "manifest.json" {
            std::os::unix::fs::symlink(&path, dir.join(name)).expect("link");
        }
    }
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("manifest.json")).expect("read"))
            .expect("json");
    edit(&mut manifest);
    write_manifest(
        &dir,
        &serde_json::to_string_pretty(&manifest).expect("json"),
    );
    (tmp, dir)
}

fn write_manifest(dir: &Path, text: &str) {
    std::fs::write(dir.join("manifest.json"), text).expect("write");
}

fn load_err(dir: &Path) -> ModelError {
    match ModelPackage::load(dir, Device::Cpu) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn an_intact_copy_loads() {
    let (_tmp, dir) = package(|_| {});
    ModelPackage::load(&dir, Device::Cpu).expect("intact copy loads");
}

#[test]
fn missing_segment_file_is_named() {
    let (_tmp, dir) = package(|_| {});
    std::fs::remove_file(dir.join("05_blocks_2.pt")).expect("rm");
    let e = load_err(&dir);
    assert!(
        matches!(e, ModelError::MissingSegment { layer: 5, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("05_blocks_2.pt"), "{e}");
}

#[test]
fn manifest_that_does_not_parse_is_named_with_its_position() {
    let (_tmp, dir) = package(|_| {});
    write_manifest(&dir, "{\n  \"format\": 1,\n  \"name\": \n}");
    let e = load_err(&dir);
    let text = e.to_string();
    assert!(matches!(e, ModelError::ManifestParse { .. }), "{text}");
    assert!(
        text.contains("manifest.json") && text.contains("line 4"),
        "{text}"
    );
}

#[test]
fn unknown_manifest_key_is_named() {
    let (_tmp, dir) = package(|m| m["freeze"] = Value::from(3));
    let text = load_err(&dir).to_string();
    assert!(text.contains("unknown field `freeze`"), "{text}");
}

#[test]
fn shapes_that_do_not_chain_are_named() {
    let (_tmp, dir) = package(|m| m["layers"][7]["input_shape"] = serde_json::json!([24, 56, 57]));
    let e = load_err(&dir);
    let text = e.to_string();
    assert!(matches!(e, ModelError::InvalidManifest { .. }), "{text}");
    assert!(
        text.contains("shapes do not chain: layer 7 `blocks.4`"),
        "{text}"
    );
    assert!(text.contains("[24, 56, 57]"), "{text}");
}

#[test]
fn declared_output_shape_that_the_segment_does_not_produce_is_named() {
    // Consistent on paper (input and output shapes chain), wrong in fact: caught at run time.
    let (_tmp, dir) = package(|m| {
        m["layers"][0]["output_shape"] = serde_json::json!([32, 111, 111]);
        m["layers"][1]["input_shape"] = serde_json::json!([32, 111, 111]);
    });
    let pkg = ModelPackage::load(&dir, Device::Cpu).expect("loads");
    let x = Tensor::zeros([1, 3, 224, 224], (Kind::Float, Device::Cpu));
    let e = pkg.run(0..1, &x).expect_err("wrong output shape");
    assert!(matches!(e, ModelError::OutputShape { layer: 0, .. }), "{e}");
    assert!(e.to_string().contains("[32, 112, 112]"), "{e}");
}

#[test]
fn a_layer_holding_more_parameters_than_declared_is_refused() {
    // The host charges a loaded model's memory by these counts: one that understates its
    // weights is refused. Declaring more (an over-charge) is the package's own loss.
    let (_tmp, dir) = package(|m| {
        let declared = m["layers"][0]["params"].as_u64().expect("params");
        m["layers"][0]["params"] = serde_json::json!(declared - 1);
    });
    let e = load_err(&dir);
    assert!(
        matches!(e, ModelError::UndeclaredParameters { layer: 0, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("holds 864 parameters"), "{e}");
    let (_tmp, dir) = package(|m| m["layers"][0]["params"] = serde_json::json!(1_000_000));
    ModelPackage::load(&dir, Device::Cpu).expect("declaring more loads");
}

#[test]
fn corrupt_segment_file_is_named() {
    let (_tmp, dir) = package(|_| {});
    let seg = dir.join("02_act0.pt");
    std::fs::remove_file(&seg).expect("rm link");
    std::fs::write(&seg, b"this is not a TorchScript archive").expect("write");
    let e = load_err(&dir);
    assert!(matches!(e, ModelError::SegmentLoad { .. }), "{e}");
    assert!(e.to_string().contains("02_act0.pt"), "{e}");
}

#[test]
fn segment_path_escaping_the_package_is_refused() {
    let (_tmp, dir) = package(|m| m["layers"][0]["file"] = Value::from("../../etc/passwd"));
    let text = load_err(&dir).to_string();
    assert!(text.contains("must be a plain file name"), "{text}");
}

#[test]
fn freeze_index_past_the_end_is_refused() {
    let (_tmp, dir) = package(|m| m["freeze_index"] = Value::from(99));
    let text = load_err(&dir).to_string();
    assert!(
        text.contains("freeze_index 99 is past the last layer"),
        "{text}"
    );
}

#[test]
fn declared_numbers_past_their_bounds_are_refused_before_anything_is_loaded() {
    // Each would have the host charge or allocate from a number it cannot hold: 4 * 2^62
    // parameters wrapped to 0 bytes of weights in a release build; a crop of 16,384 had
    // measurement allocate some 67 GB; a shape's element count could overflow.
    type Edit = fn(&mut Value);
    let cases: [(Edit, &str); 5] = [
        (
            |m| m["layers"][0]["params"] = serde_json::json!(1u64 << 62),
            "params 4611686018427387904 is past",
        ),
        (
            |m| {
                m["input"]["crop"] = serde_json::json!(16384);
                m["input"]["resize"] = serde_json::json!(16384);
            },
            "input.resize 16384 is past 8192 pixels",
        ),
        (
            |m| {
                let big = serde_json::json!([1i64 << 31, 1i64 << 31, 4]);
                m["layers"][0]["output_shape"] = big.clone();
                m["layers"][1]["input_shape"] = big;
            },
            "more than 268435456 elements per sample",
        ),
        (
            |m| m["layers"][0]["output_shape"] = serde_json::json!([1, 1, 1, 1, 1, 1, 1, 1, 1]),
            "at most 8 dimensions",
        ),
        (
            |m| {
                let layer = m["layers"][0].clone();
                let layers = m["layers"].as_array_mut().expect("layers");
                layers.resize(4097, layer);
            },
            "4097 layers; at most 4096",
        ),
    ];
    for (edit, says) in cases {
        let (_tmp, dir) = package(edit);
        let e = load_err(&dir);
        assert!(matches!(e, ModelError::InvalidManifest { .. }), "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    let (_tmp, dir) = package(|_| {});
    let padded = format!(
        "{}{}",
        " ".repeat(1 << 20),
        std::fs::read_to_string(dir.join("manifest.json")).expect("manifest")
    );
    std::fs::write(dir.join("manifest.json"), padded).expect("write");
    let e = load_err(&dir);
    assert!(e.to_string().contains("more than 1048576 bytes"), "{e}");
}
