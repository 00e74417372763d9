//! `hapi-data import`: a folder of images (ImageFolder) or WebDataset `.tar` shards into any
//! store, in the layout the trainer reads: `<prefix>/{train,test}/<class>/<name>`.
//!
//! Sources:
//! - a directory `<class>/<image>`: each image goes to `train` or `test` by a hash of its class
//!   and file name against `--test-fraction` (so a re-run, or a grown folder, puts every image
//!   where it went before);
//! - a directory already split, `{train,test,val}/<class>/<image>` (`val` becomes `test`);
//! - WebDataset shards (`.tar` files, or a directory of them): a sample is the files sharing a
//!   base name, one image (`.jpg`, `.jpeg`, `.png`, `.webp`) and its class in `.cls`. A shard
//!   whose file name contains `train`, `test` or `val` goes to that split; others by hash.
//!
//! Images are stored byte for byte as they are (JPEG, PNG and WebP, which both tiers decode);
//! each is checked first by its magic bytes and header. Anything else (a `README`, a `.DS_Store`,
//! a truncated JPEG, a file over [`MAX_IMAGE_FILE`]) is left out and reported, with the reason,
//! in the summary and in `<prefix>/manifest.json`. Inside a source directory, symbolic links are
//! not followed and only regular files are read (a link could bring in any file the importing
//! user may read, into a prefix other tenants are granted; a FIFO would block the import). A
//! shard's images are read from the shard when they are written, not held in memory. Objects already in the store with the same size are skipped, so an
//! interrupted import resumes where it stopped; the manifest is written last.

use crate::store::{Item, put_all};
use crate::{DatasetManifest, LoadReport};
use anyhow::{Context, bail};
use futures::TryStreamExt;
use image::ImageFormat;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

/// The largest file imported as one image: as many bytes as the largest image the pushdown
/// decodes takes decoded (`hapi_preprocess::MAX_DECODE_BYTES`, 256 MiB). A larger file is left
/// out before it is read.
pub const MAX_IMAGE_FILE: u64 = hapi_preprocess::MAX_DECODE_BYTES;
/// The largest `.cls` member of a WebDataset sample read.
const MAX_CLASS_BYTES: u64 = 4096;
/// Files left out that are listed with their reasons (in the summary and the manifest); the
/// rest are counted.
pub const MAX_LISTED: usize = 10_000;

/// What `import` is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Directories or `.tar` files.
    pub sources: Vec<PathBuf>,
    /// Key prefix in the bucket.
    pub prefix: String,
    /// Share of an unsplit source that goes to `test`, in [0, 1).
    pub test_fraction: f64,
    /// Objects written at once.
    pub concurrency: usize,
}

/// A file that was not imported, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// The files left out: the first [`MAX_LISTED`] with their reasons, and how many more (a shard
/// of a million junk members made a list, and a manifest, as long).
#[derive(Debug, Default)]
struct Skips {
    listed: Vec<Skipped>,
    more: usize,
}

impl Skips {
    fn push(&mut self, s: Skipped) {
        if self.listed.len() < MAX_LISTED {
            self.listed.push(s);
        } else {
            self.more += 1;
        }
    }

    fn len(&self) -> usize {
        self.listed.len() + self.more
    }

    fn first(&self) -> Option<&Skipped> {
        self.listed.first()
    }

    /// The listed ones, and an entry counting the others if there are any.
    fn into_list(mut self) -> Vec<Skipped> {
        if self.more > 0 {
            self.listed.push(Skipped {
                path: format!("({} more)", self.more),
                reason: format!("left out, not listed (only the first {MAX_LISTED} are)"),
            });
        }
        self.listed
    }
}

/// What an import did.
#[derive(Clone, Debug, Default)]
pub struct ImportReport {
    pub load: LoadReport,
    /// Images per split.
    pub splits: BTreeMap<String, usize>,
    pub classes: Vec<String>,
    pub skipped: Vec<Skipped>,
}

/// One image to store.
struct Sample {
    split: &'static str,
    class: String,
    name: String,
    origin: String,
    bytes: Bytes,
}

/// A file read when its bytes are written: its path, whether a link there is followed (a
/// source named on the command line) or not (a file inside a source directory), and its size
/// when it was checked.
struct Source {
    path: PathBuf,
    follow: bool,
    size: u64,
}

enum Bytes {
    /// A whole file (directory sources).
    File(Source),
    /// The bytes at (offset, length) of a shard.
    Member(Arc<Source>, u64, u64),
}

impl Bytes {
    fn len(&self) -> u64 {
        match self {
            Bytes::File(f) => f.size,
            Bytes::Member(_, _, n) => *n,
        }
    }

    /// Its bytes, from a file that is still a regular file of the size checked.
    fn read(&self) -> anyhow::Result<Vec<u8>> {
        let (src, at, len) = match self {
            Bytes::File(f) => (f, 0, f.size),
            Bytes::Member(f, at, len) => (f.as_ref(), *at, *len),
        };
        let path = &src.path;
        let (file, size) = open_regular(path, src.follow)
            .map_err(|r| anyhow::anyhow!("{}: {r}", path.display()))?;
        if size != src.size {
            bail!(
                "{}: {size} bytes, {} when it was checked: it changed during the import",
                path.display(),
                src.size
            );
        }
        let mut v = vec![0; usize::try_from(len)?];
        file.read_exact_at(&mut v, at)
            .with_context(|| format!("reading {} bytes at {at} of {}", len, path.display()))?;
        Ok(v)
    }
}

/// Opens `path` to read if it is a regular file, without waiting on a FIFO or a device, and
/// without following a symbolic link unless `follow`: the file and its size, or why not.
fn open_regular(path: &std::path::Path, follow: bool) -> Result<(std::fs::File, u64), String> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nofollow | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "a symbolic link: not followed".to_string(),
            _ => format!("cannot open: {e}"),
        })?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    Ok((file, meta.len()))
}

/// Why a file of `len` bytes is not imported, if it is too large.
fn too_large(len: u64) -> Option<String> {
    (len > MAX_IMAGE_FILE).then(|| {
        format!("{len} bytes: larger than {MAX_IMAGE_FILE}, the most one image is imported with")
    })
}

/// Where an unsplit image goes: the same answer for the same class and name on every run.
fn split_of(class: &str, name: &str, test_fraction: f64) -> &'static str {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in class.bytes().chain([0]).chain(name.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let u = (crate::SplitMix64::new(h).next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    if u < test_fraction { "test" } else { "train" }
}

fn split_named(name: &str) -> Option<&'static str> {
    match name {
        "train" => Some("train"),
        "test" | "val" | "valid" | "validation" => Some("test"),
        _ => None,
    }
}

/// JPEG, PNG or WebP by magic bytes, with a header that parses and a size the pushdown
/// decodes; the format's extension. Only the header is read.
fn check_image<R: std::io::BufRead + Seek>(head: &[u8], reader: R) -> Result<&'static str, String> {
    let (format, ext) = match image::guess_format(head) {
        Ok(ImageFormat::Jpeg) => (ImageFormat::Jpeg, "jpg"),
        Ok(ImageFormat::Png) => (ImageFormat::Png, "png"),
        Ok(ImageFormat::WebP) => (ImageFormat::WebP, "webp"),
        Ok(other) => {
            return Err(format!(
                "{other:?} is not imported (JPEG, PNG and WebP are)"
            ));
        }
        Err(_) => return Err("not an image".into()),
    };
    let (w, h) = image::ImageReader::with_format(reader, format)
        .into_dimensions()
        .map_err(|e| format!("bad {ext} header: {e}"))?;
    let max = hapi_preprocess::MAX_IMAGE_SIDE;
    if w == 0 || h == 0 || w > max || h > max {
        return Err(format!("{w}x{h}: each side must be 1..={max} pixels"));
    }
    Ok(ext)
}

fn sorted_entries(dir: &std::path::Path) -> anyhow::Result<Vec<std::fs::DirEntry>> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    v.sort_by_key(std::fs::DirEntry::file_name);
    Ok(v)
}

fn name_of(e: &std::fs::DirEntry) -> anyhow::Result<String> {
    e.file_name()
        .into_string()
        .map_err(|n| anyhow::anyhow!("{}: a name that is not UTF-8: {n:?}", e.path().display()))
}

/// The images of one class directory.
fn class_dir(
    dir: &std::path::Path,
    class: &str,
    split: Option<&'static str>,
    test_fraction: f64,
    out: &mut Vec<Sample>,
    skipped: &mut Skips,
) -> anyhow::Result<()> {
    for e in sorted_entries(dir)? {
        let path = e.path();
        let origin = path.display().to_string();
        if e.file_type()?.is_dir() {
            skipped.push(Skipped {
                path: origin,
                reason: "a directory inside a class directory".into(),
            });
            continue;
        }
        let name = name_of(&e)?;
        let (mut file, len) = match open_regular(&path, false) {
            Ok(opened) => opened,
            Err(reason) => {
                skipped.push(Skipped {
                    path: origin,
                    reason,
                });
                continue;
            }
        };
        if let Some(reason) = too_large(len) {
            skipped.push(Skipped {
                path: origin,
                reason,
            });
            continue;
        }
        let mut head = [0u8; 64];
        let n = file
            .read(&mut head)
            .with_context(|| format!("reading {origin}"))?;
        file.rewind().with_context(|| format!("reading {origin}"))?;
        match check_image(&head[..n], std::io::BufReader::new(file)) {
            Ok(_) => out.push(Sample {
                split: split.unwrap_or_else(|| split_of(class, &name, test_fraction)),
                class: class.to_string(),
                name,
                origin,
                bytes: Bytes::File(Source {
                    path,
                    follow: false,
                    size: len,
                }),
            }),
            Err(reason) => skipped.push(Skipped {
                path: origin,
                reason,
            }),
        }
    }
    Ok(())
}

/// An ImageFolder directory, split or not.
fn directory(
    root: &std::path::Path,
    test_fraction: f64,
    out: &mut Vec<Sample>,
    skipped: &mut Skips,
) -> anyhow::Result<()> {
    let entries = sorted_entries(root)?;
    let dirs: Vec<&std::fs::DirEntry> = entries
        .iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .collect();
    let presplit = !dirs.is_empty()
        && dirs
            .iter()
            .all(|e| e.file_name().to_str().and_then(split_named).is_some());
    for e in &entries {
        if !e.file_type()?.is_dir() {
            skipped.push(Skipped {
                path: e.path().display().to_string(),
                reason: "a file outside the class directories".into(),
            });
        }
    }
    if dirs.is_empty() {
        bail!(
            "{}: no class directories (expected <class>/<image> or {{train,test}}/<class>/<image>)",
            root.display()
        );
    }
    for d in dirs {
        let name = name_of(d)?;
        if presplit {
            let split = split_named(&name);
            for c in sorted_entries(&d.path())? {
                if c.file_type()?.is_dir() {
                    let class = name_of(&c)?;
                    class_dir(&c.path(), &class, split, test_fraction, out, skipped)?;
                } else {
                    skipped.push(Skipped {
                        path: c.path().display().to_string(),
                        reason: "a file outside the class directories".into(),
                    });
                }
            }
        } else {
            class_dir(&d.path(), &name, None, test_fraction, out, skipped)?;
        }
    }
    Ok(())
}

/// A WebDataset sample's files so far: the image (its offset in the shard, length, and
/// extension; or why it is left out) and the class.
type Parts = (
    Option<Result<(u64, u64, &'static str), String>>,
    Option<String>,
);

/// One WebDataset shard: samples grouped by base name, an image and a `.cls`. `follow`: a link
/// at `path` is followed (a shard named on the command line).
fn shard(
    path: &std::path::Path,
    follow: bool,
    test_fraction: f64,
    out: &mut Vec<Sample>,
    skipped: &mut Skips,
) -> anyhow::Result<()> {
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let split = ["train", "test", "val"]
        .into_iter()
        .find(|s| file_name.contains(s))
        .and_then(split_named);
    let (f, size) = match open_regular(path, follow) {
        Ok(opened) => opened,
        Err(reason) => {
            skipped.push(Skipped {
                path: path.display().to_string(),
                reason,
            });
            return Ok(());
        }
    };
    let shard = Arc::new(Source {
        path: path.to_path_buf(),
        follow,
        size,
    });
    let mut archive = tar::Archive::new(std::io::BufReader::new(f));
    let mut samples: BTreeMap<String, Parts> = BTreeMap::new();
    for entry in archive
        .entries()
        .with_context(|| format!("reading {}", path.display()))?
    {
        let mut entry = entry.with_context(|| format!("reading {}", path.display()))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let member = entry.path()?.to_string_lossy().into_owned();
        // WebDataset: the key is everything before the first dot of the last path segment.
        let (dir, last) = member.rsplit_once('/').unwrap_or(("", &member));
        let Some((stem, ext)) = last.split_once('.') else {
            skipped.push(Skipped {
                path: format!("{}:{member}", path.display()),
                reason: "no extension".into(),
            });
            continue;
        };
        let key = if dir.is_empty() {
            stem.to_string()
        } else {
            format!("{dir}/{stem}")
        };
        // The header's size (a PAX record may say any) is not trusted for an allocation: a
        // member is read only up to its bound, and only if it is the sample's image or class.
        let (size, at) = (entry.size(), entry.raw_file_position());
        match ext.to_ascii_lowercase().as_str() {
            "cls" => {
                let mut bytes = Vec::new();
                (&mut entry)
                    .take(MAX_CLASS_BYTES + 1)
                    .read_to_end(&mut bytes)?;
                let class = if bytes.len() as u64 > MAX_CLASS_BYTES {
                    String::new() // refused below as a bad class
                } else {
                    String::from_utf8_lossy(&bytes).trim().to_string()
                };
                samples.entry(key).or_default().1 = Some(class);
            }
            "jpg" | "jpeg" | "png" | "webp" => {
                let image = match too_large(size) {
                    Some(reason) => Err(reason),
                    None => {
                        let mut bytes = Vec::with_capacity(size.min(1 << 20) as usize);
                        (&mut entry).take(size).read_to_end(&mut bytes)?;
                        check_image(&bytes, std::io::Cursor::new(&bytes))
                            .and_then(|ext| {
                                (bytes.len() as u64 == size)
                                    .then_some(ext)
                                    .ok_or_else(|| "truncated shard member".to_string())
                            })
                            .map(|ext| (at, size, ext))
                    }
                };
                samples.entry(key).or_default().0 = Some(image);
            }
            _ => {} // other fields of the sample (json, txt...) are not the trainer's: not read
        }
    }
    for (key, (image, class)) in samples {
        let origin = format!("{}:{key}", path.display());
        let (Some(image), Some(class)) = (image, class) else {
            skipped.push(Skipped {
                path: origin,
                reason: "a sample needs an image (.jpg, .png, .webp) and a class (.cls)".into(),
            });
            continue;
        };
        let class = match class.parse::<u32>() {
            Ok(n) => format!("{n:04}"),
            Err(_) if !class.is_empty() && !class.contains('/') => class,
            Err(_) => {
                skipped.push(Skipped {
                    path: origin,
                    reason: format!("bad class `{class}`"),
                });
                continue;
            }
        };
        match image {
            Ok((at, len, ext)) => {
                let stem = key.replace('/', "_");
                let name = format!("{stem}.{ext}");
                out.push(Sample {
                    split: split.unwrap_or_else(|| split_of(&class, &name, test_fraction)),
                    class,
                    name,
                    origin,
                    bytes: Bytes::Member(Arc::clone(&shard), at, len),
                });
            }
            Err(reason) => skipped.push(Skipped {
                path: origin,
                reason,
            }),
        }
    }
    Ok(())
}

/// Imports `opts.sources` into `store` (the bucket) under `opts.prefix`.
pub async fn import(store: &Arc<dyn ObjectStore>, opts: &Options) -> anyhow::Result<ImportReport> {
    if !(0.0..1.0).contains(&opts.test_fraction) {
        bail!("--test-fraction {}: must be in [0, 1)", opts.test_fraction);
    }
    let prefix = Path::parse(opts.prefix.trim_matches('/'))
        .with_context(|| format!("prefix `{}`", opts.prefix))?;
    if prefix.as_ref().is_empty() {
        bail!("an empty prefix: name the data set's prefix with --prefix");
    }
    let mut samples = Vec::new();
    let mut skipped = Skips::default();
    for src in &opts.sources {
        // The paths named are followed (the operator's choice), links inside them are not.
        let meta = std::fs::metadata(src).with_context(|| format!("{}", src.display()))?;
        let is_tar = |p: &std::path::Path| p.extension().is_some_and(|e| e == "tar");
        if meta.is_file() && is_tar(src) {
            shard(src, true, opts.test_fraction, &mut samples, &mut skipped)?;
        } else if meta.is_dir() {
            let entries = sorted_entries(src)?;
            let tars: Vec<PathBuf> = entries
                .iter()
                .map(|e| e.path())
                .filter(|p| is_tar(p))
                .collect();
            if !tars.is_empty() && tars.len() == entries.len() {
                for t in tars {
                    shard(&t, false, opts.test_fraction, &mut samples, &mut skipped)?;
                }
            } else {
                directory(src, opts.test_fraction, &mut samples, &mut skipped)?;
            }
        } else {
            bail!("{}: expected a directory or a .tar shard", src.display());
        }
    }
    if samples.is_empty() {
        bail!(
            "no images found in {} ({} files left out{})",
            opts.sources
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            skipped.len(),
            skipped
                .first()
                .map(|s| format!("; first: {}: {}", s.path, s.reason))
                .unwrap_or_default()
        );
    }
    // Keys: <prefix>/<split>/<class>/<name>; two sources may not claim the same key.
    let mut by_key: HashMap<Path, usize> = HashMap::new();
    let mut keys = Vec::with_capacity(samples.len());
    let mut kept = Vec::with_capacity(samples.len());
    for s in samples {
        let key = match Path::parse(format!("{prefix}/{}/{}/{}", s.split, s.class, s.name)) {
            Ok(key) => key,
            Err(e) => {
                skipped.push(Skipped {
                    path: s.origin,
                    reason: format!("its name makes no valid object key: {e}"),
                });
                continue;
            }
        };
        kept.push(s);
        let (i, s) = (kept.len() - 1, &kept[kept.len() - 1]);
        if let Some(&j) = by_key.get(&key) {
            bail!(
                "{} and {} would both be stored as `{key}`",
                kept[j].origin,
                s.origin
            );
        }
        by_key.insert(key.clone(), i);
        keys.push(key);
    }
    let samples = kept;
    let skipped = skipped.into_list();
    // Resume: an object already there with the same size is the same image.
    let sizes: HashMap<Path, u64> = store
        .list(Some(&prefix))
        .map_ok(|m| (m.location, m.size))
        .try_collect()
        .await
        .with_context(|| format!("listing {prefix}"))?;
    let existing: HashSet<Path> = keys
        .iter()
        .zip(&samples)
        .filter(|(k, s)| sizes.get(*k) == Some(&s.bytes.len()))
        .map(|(k, _)| k.clone())
        .collect();
    let mut splits: BTreeMap<String, usize> = BTreeMap::new();
    let mut classes: Vec<String> = Vec::new();
    let mut extensions: Vec<String> = Vec::new();
    for s in &samples {
        *splits.entry(s.split.to_string()).or_default() += 1;
        if !classes.contains(&s.class) {
            classes.push(s.class.clone());
        }
        if let Some(ext) = s.name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())
            && !extensions.contains(&ext)
        {
            extensions.push(ext);
        }
    }
    classes.sort();
    extensions.sort();
    let items: Vec<Item> = keys
        .into_iter()
        .zip(samples)
        .map(|(key, s)| {
            let bytes = s.bytes;
            let read: Box<dyn FnOnce() -> anyhow::Result<Vec<u8>> + Send> =
                Box::new(move || bytes.read());
            (key, read)
        })
        .collect();
    let load = put_all(store, items, &existing, opts.concurrency, "importing").await?;
    let manifest = DatasetManifest {
        dataset: prefix.filename().unwrap_or("imported").to_string(),
        source: opts
            .sources
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        layout: "imagefolder: <prefix>/{train,test}/<class>/<name>".into(),
        classes: classes.clone(),
        splits: splits.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        extension: extensions.join(","),
        skipped: skipped.clone(),
    };
    crate::store::put_manifest(store.as_ref(), &prefix, &manifest).await?;
    Ok(ImportReport {
        load,
        splits,
        classes,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_left_out_are_listed_up_to_a_bound_and_counted_past_it() {
        let mut s = Skips::default();
        for i in 0..MAX_LISTED + 5 {
            s.push(Skipped {
                path: format!("{i}"),
                reason: "junk".into(),
            });
        }
        assert_eq!(s.len(), MAX_LISTED + 5);
        let list = s.into_list();
        assert_eq!(list.len(), MAX_LISTED + 1);
        assert_eq!(list[MAX_LISTED - 1].path, format!("{}", MAX_LISTED - 1));
        assert_eq!(list[MAX_LISTED].path, "(5 more)");
        assert!(Skips::default().into_list().is_empty());
    }

    #[test]
    fn the_split_of_an_image_depends_on_its_class_and_name_only() {
        let n = 10_000;
        let tests = (0..n)
            .filter(|i| split_of("cat", &format!("{i}.jpg"), 0.2) == "test")
            .count();
        assert!((1700..2300).contains(&tests), "{tests} of {n} in test");
        for i in 0..100 {
            let name = format!("{i}.jpg");
            assert_eq!(split_of("cat", &name, 0.2), split_of("cat", &name, 0.2));
        }
        assert!((0..100).all(|i| split_of("cat", &format!("{i}.jpg"), 0.0) == "train"));
    }
}
