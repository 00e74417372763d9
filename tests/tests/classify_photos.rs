//! EfficientNet-Lite0 with its real ImageNet weights, run from Rust through the shared
//! preprocessing, names what is in real photos that scikit-image ships.

use hapi_model::{ModelPackage, models_dir};
use hapi_preprocess::preprocess;
use hapi_tests::photos_dir;
use tch::{Device, Tensor};

#[test]
fn efficientnet_lite0_recognises_real_photos() {
    let pkg = ModelPackage::load(&models_dir().join("efficientnet_lite0"), Device::Cpu)
        .expect("EfficientNet-Lite0 package (run `cargo xtask setup`)");
    let labels = pkg.labels().expect("labels").expect("package ships labels");
    assert_eq!(labels.len(), 1000);
    let input = &pkg.manifest().input;
    let transform = input.transform();
    let cases: [(&str, &[&str]); 4] = [
        ("coffee.png", &["espresso"]),
        ("chelsea.png", &["tabby", "tiger cat", "Egyptian cat"]),
        ("rocket.jpg", &["missile", "projectile", "space shuttle"]),
        ("motorcycle_left.png", &["moped", "motor scooter"]),
    ];
    let mut batch = Vec::new();
    for (file, _) in cases {
        let path = photos_dir().join(file);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        batch.extend(preprocess(&bytes, &transform).expect("preprocess"));
    }
    let crop = i64::from(transform.crop);
    let x = Tensor::from_slice(&batch).reshape([cases.len() as i64, 3, crop, crop]);
    let logits = pkg.run(0..pkg.num_layers(), &x).expect("forward");
    let top: Vec<i64> = Vec::try_from(logits.argmax(1, false)).expect("argmax");
    for ((file, expected), class) in cases.iter().zip(top) {
        let label = &labels[usize::try_from(class).expect("class index")];
        println!("{file}: {label}");
        assert!(
            expected.contains(&label.as_str()),
            "{file}: top-1 is `{label}`, expected one of {expected:?}"
        );
    }
}
