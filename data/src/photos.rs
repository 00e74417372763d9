//! An ImageNet-like performance data set: JPEG objects of about 500x375 pixels and about
//! 100 KB, cut from the real photos that scikit-image ships, labelled by source photo.
//!
//! Pushdown pays off or not depending on what is stored (compressed photos of ~110 KB in the
//! paper's ImageNet set) versus what a layer outputs, so the objects must look like that: real
//! photographic content, real JPEG compression, ImageNet's sizes and aspect ratios.

use crate::store::{Item, existing_keys, put_all, put_manifest};
use crate::{DatasetManifest, LoadReport, SplitMix64};
use anyhow::{Context, ensure};
use image::codecs::jpeg::JpegEncoder;
use image::{DynamicImage, imageops::FilterType};
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

/// Real photographs in scikit-image's `skimage/data` (color and grayscale); each is a class.
pub const SOURCES: [&str; 15] = [
    "astronaut.png",
    "brick.png",
    "camera.png",
    "cell.png",
    "chelsea.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "moon.png",
    "motorcycle_left.png",
    "retina.jpg",
    "rocket.jpg",
];

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Number of objects; every tenth goes to the test split.
    pub count: usize,
    pub seed: u64,
    /// JPEG quality (1-100).
    pub quality: u8,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            count: 2000,
            seed: 1,
            quality: 95,
        }
    }
}

fn class_name(source: &str) -> String {
    source.split('.').next().unwrap_or(source).to_string()
}

/// Cuts object `index` from `src`: a random crop (25-100% of the area, aspect 3:4 to 4:3),
/// resized to 500x375 (one in five portrait: 375x500), mirrored half the time, with a
/// brightness change of up to 15% and mild sensor noise; JPEG-encoded at `quality`.
pub fn make_object(
    src: &DynamicImage,
    seed: u64,
    index: usize,
    quality: u8,
) -> anyhow::Result<Vec<u8>> {
    let mut rng = SplitMix64::new(seed ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let (w, h) = (f64::from(src.width()), f64::from(src.height()));
    let area = w * h * rng.range(0.25, 1.0);
    let aspect = rng.range(0.75, 4.0 / 3.0);
    let cw = (area * aspect).sqrt().min(w).max(1.0);
    let ch = (area / aspect).sqrt().min(h).max(1.0);
    let x = rng.range(0.0, w - cw + 1.0).floor().min(w - cw) as u32;
    let y = rng.range(0.0, h - ch + 1.0).floor().min(h - ch) as u32;
    let (ow, oh) = if rng.next_f64() < 0.2 {
        (375, 500)
    } else {
        (500, 375)
    };
    let mut img =
        src.crop_imm(x, y, cw as u32, ch as u32)
            .resize_exact(ow, oh, FilterType::CatmullRom);
    if rng.next_f64() < 0.5 {
        img = img.fliph();
    }
    let gain = rng.range(0.85, 1.15) as f32;
    // Sensor noise: upscaled crops of small photos are smoother than camera pictures, and
    // would compress to half the size of ImageNet's JPEGs without it.
    let noise = rng.range(4.0, 8.0) as f32;
    let mut grain = SplitMix64::new(rng.next_u64());
    let mut adjust = |c: &mut u8| {
        let n = (grain.next_f64() as f32 * 2.0 - 1.0) * noise;
        *c = (f32::from(*c) * gain + n).round().clamp(0.0, 255.0) as u8;
    };
    let img = match img {
        DynamicImage::ImageLuma8(mut g) => {
            g.pixels_mut().for_each(|p| adjust(&mut p.0[0]));
            DynamicImage::ImageLuma8(g)
        }
        other => {
            let mut rgb = other.to_rgb8();
            rgb.pixels_mut()
                .for_each(|p| p.0.iter_mut().for_each(&mut adjust));
            DynamicImage::ImageRgb8(rgb)
        }
    };
    let mut out = Vec::new();
    img.write_with_encoder(JpegEncoder::new_with_quality(&mut out, quality))?;
    Ok(out)
}

/// The object key of object `index`.
pub fn key(prefix: &Path, index: usize) -> Path {
    let split = if index % 10 == 9 { "test" } else { "train" };
    prefix
        .clone()
        .join(split)
        .join(class_name(SOURCES[index % SOURCES.len()]))
        .join(format!("{index:06}.jpg"))
}

/// Writes `opts.count` objects cut from the photos in `photos_dir` under `prefix`.
pub async fn load(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    photos_dir: &std::path::Path,
    opts: Options,
) -> anyhow::Result<LoadReport> {
    ensure!(
        (1..=100).contains(&opts.quality),
        "JPEG quality {} is not in 1..=100",
        opts.quality
    );
    let mut sources = Vec::new();
    for name in SOURCES {
        let path = photos_dir.join(name);
        let img =
            image::open(&path).with_context(|| format!("reading photo {}", path.display()))?;
        sources.push(Arc::new(match img {
            DynamicImage::ImageLuma8(_) | DynamicImage::ImageRgb8(_) => img,
            other => DynamicImage::ImageRgb8(other.to_rgb8()),
        }));
    }
    let existing = existing_keys(store.as_ref(), prefix).await?;
    let items: Vec<Item> = (0..opts.count)
        .map(|i| {
            let src = Arc::clone(&sources[i % sources.len()]);
            let encode: Box<dyn FnOnce() -> anyhow::Result<Vec<u8>> + Send> =
                Box::new(move || make_object(&src, opts.seed, i, opts.quality));
            (key(prefix, i), encode)
        })
        .collect();
    let report = put_all(store, items, &existing, 4, "photos").await?;
    let test = (0..opts.count).filter(|i| i % 10 == 9).count();
    let manifest = DatasetManifest {
        dataset: "photos".into(),
        source: format!(
            "crops of scikit-image sample photos ({}), seed {}, JPEG quality {}",
            photos_dir.display(),
            opts.seed,
            opts.quality
        ),
        layout: "ImageFolder: <split>/<class>/<id>.jpg, 500x375 or 375x500 JPEG".into(),
        classes: SOURCES.iter().map(|s| class_name(s)).collect(),
        splits: vec![("train".into(), opts.count - test), ("test".into(), test)],
        extension: "jpg".into(),
        skipped: Vec::new(),
    };
    put_manifest(store.as_ref(), prefix, &manifest).await?;
    Ok(report)
}
