//! The shipped model packages, run through libtorch from Rust.

use hapi_model::{ModelPackage, list_packages, models_dir};
use tch::{Device, Kind, Tensor};

/// Every package the exporter ships (DESIGN.md, "Model packages").
const SHIPPED: [&str; 7] = [
    "alexnet",
    "densenet121",
    "efficientnet_lite0",
    "resnet18",
    "resnet50",
    "vgg11",
    "vit_b_16",
];
const TOLERANCE: f64 = 1e-5;

fn load(name: &str) -> ModelPackage {
    let dir = models_dir().join(name);
    ModelPackage::load(&dir, Device::Cpu).unwrap_or_else(|e| {
        panic!(
            "loading {} (run `cargo xtask setup` first): {e}",
            dir.display()
        )
    })
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

#[test]
fn every_model_is_shipped() {
    let dirs = list_packages(&models_dir()).expect("models directory (run `cargo xtask setup`)");
    let names: Vec<String> = dirs
        .iter()
        .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(names, SHIPPED);
    for name in SHIPPED {
        let m = hapi_model::Manifest::load(&models_dir().join(name)).expect("manifest");
        assert_eq!(m.name, name);
        assert!(
            m.freeze_index > 0 && m.freeze_index < m.layers.len(),
            "{name}"
        );
        // Only EfficientNet-Lite0 has trained weights; the others say they are random.
        assert_eq!(m.is_random_init(), name != "efficientnet_lite0", "{name}");
    }
}

#[test]
fn paper_freeze_indices_are_kept() {
    for (name, freeze) in [
        ("alexnet", 17),
        ("resnet18", 11),
        ("resnet50", 21),
        ("vgg11", 25),
        ("densenet121", 20),
        ("vit_b_16", 17),
    ] {
        let m = hapi_model::Manifest::load(&models_dir().join(name)).expect("manifest");
        assert_eq!(m.freeze_index, freeze, "{name}");
    }
}

#[test]
fn chaining_all_segments_equals_the_whole_model() {
    for name in SHIPPED {
        let pkg = load(name);
        let (input, whole) = pkg.reference().expect("reference");
        let chained = pkg.run(0..pkg.num_layers(), &input).expect("run");
        let diff = max_abs_diff(&chained, &whole);
        assert!(diff <= TOLERANCE, "{name}: max |chain - whole| = {diff:e}");
        // A random-weights network must still give distinct outputs for distinct inputs,
        // or equality above would prove nothing.
        let spread = (whole.get(0) - whole.get(1)).abs().max().double_value(&[]);
        assert!(
            spread > 1e-4,
            "{name}: outputs for different inputs are identical"
        );
    }
}

#[test]
fn running_a_prefix_then_the_rest_equals_running_everything_for_every_split() {
    for name in SHIPPED {
        let pkg = load(name);
        let n = pkg.num_layers();
        let (input, _) = pkg.reference().expect("reference");
        let input = input.narrow(0, 0, 1);
        let whole = pkg.run(0..n, &input).expect("whole");
        let mut prefix = input.shallow_clone(); // output of [0, a)
        for a in 0..=n {
            let rest = pkg.run(a..n, &prefix).expect("rest");
            let diff = max_abs_diff(&rest, &whole);
            assert!(diff <= TOLERANCE, "{name}: split {a}: max diff {diff:e}");
            if a < n {
                prefix = pkg.run(a..a + 1, &prefix).expect("layer");
            }
        }
    }
}

#[test]
fn batch_size_does_not_change_a_sample_s_output() {
    // Frozen layers run in eval mode: batch mates must not matter (BatchNorm, dropout).
    let pkg = load("resnet18");
    let (input, _) = pkg.reference().expect("reference");
    let both = pkg.run(0..pkg.freeze_index(), &input).expect("batch 2");
    for i in 0..2 {
        let one = pkg
            .run(0..pkg.freeze_index(), &input.narrow(0, i, 1))
            .expect("batch 1");
        assert!(max_abs_diff(&one, &both.narrow(0, i, 1)) <= TOLERANCE);
    }
}

mod bad_input {
    use super::*;
    use hapi_model::ModelError;

    fn err(r: hapi_model::Result<Tensor>) -> ModelError {
        match r {
            Ok(t) => panic!("expected an error, got a tensor of shape {:?}", t.size()),
            Err(e) => e,
        }
    }

    #[test]
    fn wrong_element_type_is_rejected() {
        let pkg = load("resnet18");
        let x = Tensor::zeros([1, 3, 224, 224], (Kind::Double, Device::Cpu));
        let e = err(pkg.run(0..2, &x));
        assert!(matches!(e, ModelError::BadInput { layer: 0, .. }), "{e}");
        assert!(e.to_string().contains("Double, expected f32"), "{e}");
    }

    #[test]
    fn wrong_rank_is_rejected() {
        let pkg = load("resnet18");
        let e = err(pkg.run(
            0..2,
            &Tensor::zeros([3, 224, 224], (Kind::Float, Device::Cpu)),
        ));
        assert!(e.to_string().contains("rank 3"), "{e}");
    }

    #[test]
    fn wrong_shape_for_the_first_layer_of_the_range_is_rejected() {
        let pkg = load("resnet18");
        // A valid model input is not a valid input for layer 4 (after the max-pool).
        let x = Tensor::zeros([1, 3, 224, 224], (Kind::Float, Device::Cpu));
        let e = err(pkg.run(4..6, &x));
        let text = e.to_string();
        assert!(text.contains("layer 4 `layer1.0`"), "{text}");
        assert!(
            text.contains("[3, 224, 224], expected [64, 56, 56]"),
            "{text}"
        );
    }

    #[test]
    fn empty_batch_is_rejected() {
        let pkg = load("resnet18");
        let e = err(pkg.run(
            0..1,
            &Tensor::zeros([0, 3, 224, 224], (Kind::Float, Device::Cpu)),
        ));
        assert!(e.to_string().contains("empty batch"), "{e}");
    }

    #[test]
    fn layer_range_outside_the_model_is_rejected() {
        let pkg = load("resnet18");
        let x = Tensor::zeros([1, 3, 224, 224], (Kind::Float, Device::Cpu));
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is one of the bad inputs
        for range in [0..16, 5..3] {
            let e = err(pkg.run(range.clone(), &x));
            assert!(matches!(e, ModelError::LayerRange { .. }), "{range:?}: {e}");
        }
    }

    #[test]
    fn bytes_that_do_not_match_their_dims_are_rejected() {
        use hapi_model::tensor::f32_from_le_bytes;
        let e = f32_from_le_bytes(&[2, 3], &[0u8; 20]).expect_err("short");
        assert!(e.contains("need 24 bytes of f32, got 20"), "{e}");
        let e = f32_from_le_bytes(&[2, -3], &[0u8; 24]).expect_err("negative");
        assert!(e.contains("dimension 1 is -3"), "{e}");
        let e = f32_from_le_bytes(&[1 << 40, 1 << 40], &[]).expect_err("huge");
        assert!(e.contains("exceed"), "{e}");
        let t = f32_from_le_bytes(&[2], &[0, 0, 128, 63, 0, 0, 0, 64]).expect("1.0, 2.0");
        assert_eq!(Vec::<f32>::try_from(&t).expect("vec"), [1.0, 2.0]);
    }
}
