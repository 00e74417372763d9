//! Fashion-MNIST from Debian's `dataset-fashion-mnist` (IDX files, gzipped) into an object
//! store, one grayscale PNG per sample.

use crate::store::{Item, existing_keys, put_all, put_manifest};
use crate::{DatasetManifest, LoadReport};
use anyhow::{Context, bail, ensure};
use flate2::read::GzDecoder;
use image::{ExtendedColorType, ImageEncoder, codecs::png::PngEncoder};
use object_store::ObjectStore;
use object_store::path::Path;
use std::io::Read;
use std::sync::Arc;

/// Where Debian's package puts the files.
pub const DEFAULT_SOURCE: &str = "/usr/share/datasets/fashion-mnist";

/// Class directory names in label order (the `NN_` prefix keeps ImageFolder's sorted order
/// equal to the label order).
pub const CLASSES: [&str; 10] = [
    "00_tshirt_top",
    "01_trouser",
    "02_pullover",
    "03_dress",
    "04_coat",
    "05_sandal",
    "06_shirt",
    "07_sneaker",
    "08_bag",
    "09_ankle_boot",
];

/// The two splits and their file name stems.
pub const SPLITS: [(&str, &str); 2] = [("train", "train"), ("test", "t10k")];

/// One split as read from the IDX files: 28x28 u8 images and their labels.
#[derive(Debug)]
pub struct Split {
    pub rows: usize,
    pub cols: usize,
    pub pixels: Vec<u8>,
    pub labels: Vec<u8>,
}

impl Split {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.rows * self.cols;
        &self.pixels[i * n..(i + 1) * n]
    }
}

fn read_gz(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    GzDecoder::new(file)
        .read_to_end(&mut out)
        .with_context(|| format!("decompressing {}", path.display()))?;
    Ok(out)
}

fn be_u32(data: &[u8], at: usize) -> usize {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize
}

/// Reads `<stem>-images-idx3-ubyte.gz` and `<stem>-labels-idx1-ubyte.gz` from `dir`.
pub fn read_split(dir: &std::path::Path, stem: &str) -> anyhow::Result<Split> {
    let images_path = dir.join(format!("{stem}-images-idx3-ubyte.gz"));
    let labels_path = dir.join(format!("{stem}-labels-idx1-ubyte.gz"));
    let images = read_gz(&images_path)?;
    let labels = read_gz(&labels_path)?;
    let bad = |p: &std::path::Path, what: &str| format!("{}: {what}", p.display());
    ensure!(
        images.len() >= 16 && be_u32(&images, 0) == 0x803,
        bad(&images_path, "not an IDX3 image file")
    );
    ensure!(
        labels.len() >= 8 && be_u32(&labels, 0) == 0x801,
        bad(&labels_path, "not an IDX1 label file")
    );
    let (n, rows, cols) = (be_u32(&images, 4), be_u32(&images, 8), be_u32(&images, 12));
    ensure!(
        images.len() == 16 + n * rows * cols,
        bad(
            &images_path,
            &format!("{} bytes, header says {n} x {rows} x {cols}", images.len())
        )
    );
    ensure!(
        be_u32(&labels, 4) == n && labels.len() == 8 + n,
        bad(
            &labels_path,
            &format!("label count does not match the {n} images")
        )
    );
    let labels = labels[8..].to_vec();
    if let Some(l) = labels.iter().find(|&&l| usize::from(l) >= CLASSES.len()) {
        bail!(bad(
            &labels_path,
            &format!("label {l} is not a Fashion-MNIST class")
        ));
    }
    Ok(Split {
        rows,
        cols,
        pixels: images[16..].to_vec(),
        labels,
    })
}

/// The object key of sample `index` of `split`.
pub fn key(prefix: &Path, split: &str, label: u8, index: usize) -> Path {
    prefix
        .clone()
        .join(split)
        .join(CLASSES[usize::from(label)])
        .join(format!("{index:05}.png"))
}

/// Encodes a grayscale image as PNG.
pub fn encode_png(pixels: &[u8], width: u32, height: u32) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    PngEncoder::new(&mut out).write_image(pixels, width, height, ExtendedColorType::L8)?;
    Ok(out)
}

/// Writes both splits from `source` under `prefix`; skips objects that exist.
pub async fn load(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    source: &std::path::Path,
) -> anyhow::Result<LoadReport> {
    let existing = existing_keys(store.as_ref(), prefix).await?;
    let mut report = LoadReport::default();
    let mut splits = Vec::new();
    for (split, stem) in SPLITS {
        let data = Arc::new(read_split(source, stem)?);
        splits.push((split.to_string(), data.len()));
        let items: Vec<Item> = (0..data.len())
            .map(|i| {
                let key = key(prefix, split, data.labels[i], i);
                let data = Arc::clone(&data);
                let encode: Box<dyn FnOnce() -> anyhow::Result<Vec<u8>> + Send> =
                    Box::new(move || encode_png(data.image(i), data.cols as u32, data.rows as u32));
                (key, encode)
            })
            .collect();
        let r = put_all(store, items, &existing, 64, split).await?;
        report.written += r.written;
        report.skipped += r.skipped;
        report.bytes_written += r.bytes_written;
    }
    let manifest = DatasetManifest {
        dataset: "fashion-mnist".into(),
        source: format!("Debian dataset-fashion-mnist ({})", source.display()),
        layout: "ImageFolder: <split>/<class>/<id>.png, 28x28 grayscale".into(),
        classes: CLASSES.iter().map(|c| c.to_string()).collect(),
        splits,
        extension: "png".into(),
        skipped: Vec::new(),
    };
    put_manifest(store.as_ref(), prefix, &manifest).await?;
    Ok(report)
}
