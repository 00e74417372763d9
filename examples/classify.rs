//! Classify photos with EfficientNet-Lite0 (ImageNet weights): the whole model, run from Rust.
//!
//! ```text
//! cargo xtask setup
//! cargo run -p hapi-examples --example classify -- .hapi/photos/coffee.png .hapi/photos/chelsea.png
//! ```

use anyhow::Context;
use hapi_model::{ModelPackage, device, models_dir};
use hapi_preprocess::preprocess;

fn main() -> anyhow::Result<()> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(!files.is_empty(), "usage: classify IMAGE...");
    let pkg = ModelPackage::load(
        &models_dir().join("efficientnet_lite0"),
        device::from_env()?,
    )?;
    let labels = pkg.labels()?.context("package has no labels")?;
    let input = &pkg.manifest().input;
    let transform = input.transform();
    for file in files {
        let bytes = std::fs::read(&file).with_context(|| format!("reading {file}"))?;
        let x = preprocess(&bytes, &transform).with_context(|| file.clone())?;
        let crop = i64::from(transform.crop);
        let x = tch::Tensor::from_slice(&x).reshape([1, 3, crop, crop]);
        let probs = pkg
            .run(0..pkg.num_layers(), &x)?
            .softmax(1, tch::Kind::Float);
        let (p, i) = probs.topk(3, 1, true, true);
        let p: Vec<f32> = Vec::try_from(p.view(-1))?;
        let i: Vec<i64> = Vec::try_from(i.view(-1))?;
        let top: Vec<String> = p
            .iter()
            .zip(&i)
            .map(|(p, &i)| format!("{} {:.1}%", labels[i as usize], p * 100.0))
            .collect();
        println!("{file}: {}", top.join(", "));
    }
    Ok(())
}
