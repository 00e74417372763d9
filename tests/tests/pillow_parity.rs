//! The shared preprocessing against Pillow and torchvision themselves (the venv's Python, run
//! as a subprocess): the resizer gives Pillow's bytes for both filters, and the whole transform
//! gives torchvision's `Resize`, `CenterCrop`, `ToTensor`, `Normalize` bit for bit on lossless
//! images. For JPEG, where decoders may round the IDCT differently from libjpeg, the figures
//! are printed and bounded. `hapi_preprocess` decodes JPEG with `zune-jpeg` directly; its pixels
//! are `image`'s, byte for byte, on the colour modes, subsamplings and codings Pillow writes.

use hapi_preprocess::resize::{Filter, Window, resize_window};
use hapi_preprocess::{
    ChannelOrder, Decoded, Layout, ResizeMode, Scale, Transform, decode, transform_into,
};
use hapi_tests::photos_dir;
use image::{DynamicImage, GrayImage, ImageFormat, RgbImage};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const IMAGENET: ([f32; 3], [f32; 3]) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);

/// The sample photos with extension `ext`, sorted.
fn photos(ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(photos_dir())
        .expect("photos (run `cargo xtask setup`)")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

/// Runs the Python reference on `jobs`; returns each job's output bytes.
fn reference(dir: &Path, jobs: &[Value]) -> Vec<Vec<u8>> {
    let python = hapi_tests::python();
    let spec = dir.join("jobs.json");
    std::fs::write(&spec, serde_json::to_vec(jobs).expect("json")).expect("write jobs");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).expect("mkdir");
    // From the run-time workspace: clones sharing a build directory share this test binary.
    let script = hapi_tests::workspace().join("tests/python/pillow_reference.py");
    let script = script.display();
    let status = Command::new(python)
        .arg(script.to_string())
        .arg(&spec)
        .arg(&out)
        .status()
        .expect("run the Python reference");
    assert!(status.success(), "{script} failed: {status}");
    (0..jobs.len())
        .map(|i| std::fs::read(out.join(format!("{i}.bin"))).expect("reference output"))
        .collect()
}

fn save_png(img: &DynamicImage, path: &Path) {
    img.save_with_format(path, ImageFormat::Png)
        .expect("write PNG");
}

/// Noise plus a gradient: every tap weight matters, and values reach both clipping ends.
fn synthetic(w: u32, h: u32, bands: u32, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..w * h * bands)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let gradient = (i / bands % w) * 255 / w.max(1);
            if s.is_multiple_of(4) {
                (s >> 8) as u8
            } else {
                gradient as u8
            }
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

#[test]
fn resizer_gives_pillows_bytes_for_both_filters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sizes = [(28, 28), (500, 375), (37, 101), (301, 299), (3, 640)];
    let targets = |w: u32, h: u32| {
        [
            (256, 256),
            (w * 3 / 7 + 1, h * 2 / 3 + 1),
            (w + 5, h / 2 + 1),
        ]
    };
    let mut cases = Vec::new();
    let mut jobs = Vec::new();
    for (n, &(w, h)) in sizes.iter().enumerate() {
        for bands in [1u32, 3] {
            let px = synthetic(w, h, bands, n as u32 * 2 + bands);
            let path = dir.path().join(format!("{n}-{bands}.png"));
            let img = if bands == 1 {
                DynamicImage::ImageLuma8(GrayImage::from_raw(w, h, px.clone()).expect("gray"))
            } else {
                DynamicImage::ImageRgb8(RgbImage::from_raw(w, h, px.clone()).expect("rgb"))
            };
            save_png(&img, &path);
            for (ow, oh) in targets(w, h) {
                for (filter, name) in [(Filter::Bilinear, "bilinear"), (Filter::Bicubic, "bicubic")]
                {
                    jobs.push(
                        json!({"op": "resize", "file": path, "size": [ow, oh], "filter": name}),
                    );
                    cases.push((px.clone(), (w, h), bands, (ow, oh), filter));
                }
            }
        }
    }
    let want = reference(dir.path(), &jobs);
    let mut failures = Vec::new();
    for ((px, (w, h), bands, (ow, oh), filter), want) in cases.into_iter().zip(want) {
        let (src, out) = ((w as usize, h as usize), (ow as usize, oh as usize));
        let win = Window {
            left: 0,
            top: 0,
            width: out.0,
            height: out.1,
        };
        let got = if bands == 1 {
            resize_window::<1>(&px, src, out, win, filter)
        } else {
            resize_window::<3>(&px, src, out, win, filter)
        };
        let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        if got.len() != want.len() || differing > 0 {
            failures.push(format!(
                "{w}x{h}x{bands} -> {ow}x{oh} {filter:?}: {differing} of {} bytes differ",
                want.len()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "resized bytes differ from Pillow's:\n{}",
        failures.join("\n")
    );
}

#[test]
fn transform_is_torchvisions_bit_for_bit_on_lossless_images() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Real photos (every 8-bit PNG scikit-image ships: RGB, grayscale, RGBA), plus a
    // Fashion-MNIST-sized image, each under two transforms.
    let mut files: Vec<PathBuf> = photos("png")
        .into_iter()
        .filter(|p| !p.ends_with("chessboard_RGB.png")) // 16-bit: Pillow keeps the high byte
        .collect();
    assert!(files.len() >= 20, "{} photos", files.len());
    let small = dir.path().join("small.png");
    let px = synthetic(28, 28, 1, 7);
    save_png(
        &DynamicImage::ImageLuma8(GrayImage::from_raw(28, 28, px).expect("gray")),
        &small,
    );
    files.push(small);
    // A tall portrait reduced: Pillow 13 runs its vertical pass first.
    let tall = dir.path().join("tall.png");
    let px = synthetic(300, 700, 3, 11);
    save_png(
        &DynamicImage::ImageRgb8(RgbImage::from_raw(300, 700, px).expect("rgb")),
        &tall,
    );
    files.push(tall);
    let transforms = [
        Transform::new(256, 224, IMAGENET.0, IMAGENET.1),
        Transform::new(331, 299, [0.5; 3], [0.5; 3]),
        // A Caffe/TensorFlow-style model: squashed, bicubic, BGR, NHWC, 0-255 minus means.
        Transform {
            resize_mode: ResizeMode::Squash,
            filter: Filter::Bicubic,
            channel_order: ChannelOrder::Bgr,
            layout: Layout::Nhwc,
            scale: Scale::Byte,
            ..Transform::new(240, 224, [103.94, 116.78, 123.68], [1.0, 2.0, 0.5])
        },
    ];
    let mut jobs = Vec::new();
    for f in &files {
        jobs.push(json!({"op": "decode", "file": f}));
        for t in &transforms {
            jobs.push(torchvision_job(f, t));
        }
    }
    let mut want = reference(dir.path(), &jobs).into_iter();
    for f in &files {
        let img = decode(&std::fs::read(f).expect("read")).expect("decode");
        let rgb = match &img {
            Decoded::Gray(g) => DynamicImage::ImageLuma8(g.clone()).to_rgb8().into_raw(),
            Decoded::Rgb(c) => c.as_raw().clone(),
        };
        let pixels = want.next().expect("decode job");
        assert!(
            rgb == pixels,
            "{}: decoded pixels differ from Pillow's",
            f.display()
        );
        for t in &transforms {
            let mut got = Vec::new();
            transform_into(&img, t, &mut got).expect("transform");
            let want = f32s(&want.next().expect("torchvision job"));
            assert_eq!(got.len(), want.len(), "{}", f.display());
            let differing = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differing,
                0,
                "{} ({}/{}): {differing} of {} values differ from torchvision's",
                f.display(),
                t.resize,
                t.crop,
                want.len()
            );
        }
    }
    println!(
        "{} lossless images x {} transforms: identical to torchvision",
        files.len(),
        transforms.len()
    );
}

/// The reference job for `t`: torchvision's pipeline with the same settings.
fn torchvision_job(file: &Path, t: &Transform) -> Value {
    json!({
        "op": "torchvision", "file": file, "resize": t.resize, "crop": t.crop,
        "mean": t.mean, "std": t.std, "resize_mode": t.resize_mode.name(),
        "interpolation": t.filter.name(), "channel_order": t.channel_order.name(),
        "layout": t.layout.name(), "scale": t.scale.max(),
    })
}

#[test]
fn jpeg_photos_match_torchvision_within_decoder_rounding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = photos("jpg");
    assert!(files.len() >= 3, "{} JPEG photos", files.len());
    let t = Transform::new(256, 224, IMAGENET.0, IMAGENET.1);
    let jobs: Vec<Value> = files
        .iter()
        .flat_map(|f| [json!({"op": "decode", "file": f}), torchvision_job(f, &t)])
        .collect();
    let mut want = reference(dir.path(), &jobs).into_iter();
    for f in &files {
        let img = decode(&std::fs::read(f).expect("read")).expect("decode");
        let Decoded::Rgb(rgb) = &img else {
            panic!("{}: expected a colour JPEG", f.display())
        };
        let pixels = want.next().expect("decode job");
        assert_eq!(rgb.as_raw().len(), pixels.len(), "{}", f.display());
        let diffs: Vec<u8> = rgb
            .as_raw()
            .iter()
            .zip(&pixels)
            .map(|(a, b)| a.abs_diff(*b))
            .collect();
        let max_px = diffs.iter().copied().max().unwrap_or(0);
        let off = diffs.iter().filter(|&&d| d > 0).count() as f64 / diffs.len() as f64;
        let mut got = Vec::new();
        transform_into(&img, &t, &mut got).expect("transform");
        let want = f32s(&want.next().expect("torchvision job"));
        let dot: f64 = got
            .iter()
            .zip(&want)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let cosine = dot / (norm(&got) * norm(&want));
        let max_val = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!(
            "{}: decoded pixels off by <= {max_px} ({:.2}% differ); tensor cosine {cosine:.7}, max |diff| {max_val:.4}",
            f.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            off * 100.0
        );
        assert!(
            max_px <= 4,
            "{}: decoded pixels off by {max_px}",
            f.display()
        );
        assert!(cosine >= 0.9999, "{}: cosine {cosine}", f.display());
    }
}

/// `decode` calls `zune-jpeg` itself, not `image`'s JPEG decoder (which parses every header
/// twice): the pixels must stay those `image` gives, for the JPEGs Pillow writes in each
/// colour mode, subsampling, progressive, and with restart markers.
#[test]
fn jpeg_decoding_gives_the_pixels_of_image() {
    let dir = tempfile::tempdir().expect("tempdir");
    let photo = photos_dir().join("coffee.png");
    let small = dir.path().join("small.png");
    let gray = GrayImage::from_raw(28, 28, synthetic(28, 28, 1, 3)).expect("gray");
    save_png(&DynamicImage::ImageLuma8(gray), &small);
    let cases: Vec<(&Path, &str, Value)> = vec![
        (&photo, "RGB", json!({"quality": 90})),
        (&photo, "RGB", json!({"quality": 75, "subsampling": 0})),
        (&photo, "RGB", json!({"quality": 90, "subsampling": 1})),
        (&photo, "RGB", json!({"quality": 90, "progressive": true})),
        (
            &photo,
            "RGB",
            json!({"quality": 90, "restart_marker_blocks": 5}),
        ),
        (&photo, "L", json!({"quality": 90})),
        (&photo, "L", json!({"quality": 90, "progressive": true})),
        (&photo, "CMYK", json!({"quality": 90})),
        (&small, "L", json!({"quality": 90})),
        (&small, "RGB", json!({"quality": 50, "subsampling": 2})),
    ];
    let jobs: Vec<Value> = cases
        .iter()
        .map(|(f, mode, save)| json!({"op": "jpeg", "file": f, "mode": mode, "save": save}))
        .collect();
    let files = reference(dir.path(), &jobs);
    for ((f, mode, save), bytes) in cases.iter().zip(&files) {
        let case = format!("{} as {mode} {save}", f.display());
        let ours = decode(bytes).unwrap_or_else(|e| panic!("{case}: {e}"));
        let theirs = image::load_from_memory_with_format(bytes, ImageFormat::Jpeg)
            .unwrap_or_else(|e| panic!("{case}: image: {e}"));
        match (&ours, theirs) {
            (Decoded::Gray(a), DynamicImage::ImageLuma8(b)) => {
                assert!(*a == b, "{case}: gray pixels differ")
            }
            (Decoded::Rgb(a), DynamicImage::ImageRgb8(b)) => {
                assert!(*a == b, "{case}: RGB pixels differ")
            }
            (a, b) => {
                let ours = if matches!(a, Decoded::Gray(_)) {
                    "gray"
                } else {
                    "RGB"
                };
                panic!("{case}: decoded as {ours} against image's {:?}", b.color())
            }
        }
        let (w, h) = ours.dimensions();
        assert!(w > 0 && h > 0, "{case}: {w}x{h}");
    }
    println!(
        "{} Pillow JPEGs: the same pixels as image's decoder",
        files.len()
    );
}
