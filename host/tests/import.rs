//! `hapi-data import`: folders and WebDataset shards into the local store and into SeaweedFS
//! over S3, resumed, with what was left out named; the host then serves the imported JPEG,
//! PNG and WebP objects.

mod common;

use common::{ALICE, TestHost, features};
use hapi_data::import::{ImportReport, Options, import};
use image::{DynamicImage, ImageFormat, RgbImage};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn encode(seed: u32, format: ImageFormat) -> Vec<u8> {
    let img = RgbImage::from_fn(40 + seed % 7, 30 + seed % 5, |x, y| {
        image::Rgb([(x * 5 + seed) as u8, (y * 7) as u8, (seed * 31) as u8])
    });
    let mut buf = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img)
        .write_to(&mut buf, format)
        .expect("encode");
    buf.into_inner()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
}

/// `<root>/{cat,dog}/`: 12 images each in three formats, plus what an import must leave out.
fn image_folder(root: &Path) -> usize {
    let formats = [
        (ImageFormat::Png, "png"),
        (ImageFormat::Jpeg, "jpg"),
        (ImageFormat::WebP, "webp"),
    ];
    let mut n = 0;
    for (c, class) in ["cat", "dog"].into_iter().enumerate() {
        for i in 0..12u32 {
            let (format, ext) = formats[i as usize % 3];
            write(
                &root.join(class).join(format!("{class}-{i:02}.{ext}")),
                &encode(i + 20 * c as u32, format),
            );
            n += 1;
        }
    }
    write(&root.join("cat/notes.txt"), b"not an image");
    write(&root.join("dog/broken.jpg"), b"\xff\xd8\xff\xe0 truncated");
    write(&root.join("README.md"), b"# my images");
    n
}

fn opts(sources: Vec<PathBuf>, prefix: &str) -> Options {
    Options {
        sources,
        prefix: prefix.into(),
        test_fraction: 0.25,
        concurrency: 4,
    }
}

async fn keys(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<(String, u64)> {
    use futures::TryStreamExt;
    let mut v: Vec<(String, u64)> = store
        .list(Some(&ObjectPath::from(prefix)))
        .map_ok(|m| (m.location.to_string(), m.size))
        .try_collect()
        .await
        .expect("list");
    v.sort();
    v
}

fn skipped_reasons(r: &ImportReport) -> Vec<String> {
    r.skipped
        .iter()
        .map(|s| {
            let name = Path::new(&s.path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{name}: {}", s.reason)
        })
        .collect()
}

/// Each of `needles` begins one of the `reasons` ([`skipped_reasons`]).
fn assert_left_out(reasons: &[String], needles: &[&str]) {
    for needle in needles {
        assert!(
            reasons.iter().any(|r| r.starts_with(needle)),
            "{needle}: {reasons:?}"
        );
    }
}

/// Checks a first import of [`image_folder`] and that a second one writes nothing.
async fn import_twice(store: &Arc<dyn ObjectStore>, src: &Path, images: usize) {
    let first = import(store, &opts(vec![src.to_path_buf()], "mine"))
        .await
        .expect("import");
    assert_eq!(first.load.written, images);
    assert_eq!(first.load.skipped, 0);
    assert_eq!(first.classes, ["cat", "dog"]);
    assert_eq!(first.splits.values().sum::<usize>(), images);
    assert!(
        first
            .splits
            .get("test")
            .is_some_and(|&t| t > 0 && t < images / 2),
        "{:?}",
        first.splits
    );
    let reasons = skipped_reasons(&first);
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_left_out(
        &reasons,
        &[
            "notes.txt: not an image",
            "broken.jpg: bad jpg header",
            "README.md: a file outside the class directories",
        ],
    );
    let listed = keys(store, "mine").await;
    assert_eq!(listed.len(), images + 1, "images and the manifest");
    for (key, size) in &listed {
        if key == "mine/manifest.json" {
            continue;
        }
        // mine/<split>/<class>/<name>, byte for byte the source file.
        let parts: Vec<&str> = key.split('/').collect();
        assert!(matches!(parts[1], "train" | "test"), "{key}");
        let source = std::fs::read(src.join(parts[2]).join(parts[3])).expect("source");
        assert_eq!(source.len() as u64, *size, "{key}");
        let stored = store
            .get(&ObjectPath::from(key.as_str()))
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(stored.as_ref(), source.as_slice(), "{key}");
    }
    let manifest: serde_json::Value = serde_json::from_slice(
        &store
            .get(&ObjectPath::from("mine/manifest.json"))
            .await
            .expect("manifest")
            .bytes()
            .await
            .expect("bytes"),
    )
    .expect("json");
    assert_eq!(manifest["classes"], json!(["cat", "dog"]));
    assert_eq!(manifest["extension"], "jpg,png,webp");
    assert_eq!(manifest["skipped"].as_array().map(Vec::len), Some(3));

    let again = import(store, &opts(vec![src.to_path_buf()], "mine"))
        .await
        .expect("import again");
    assert_eq!((again.load.written, again.load.skipped), (0, images));
    // The same files land in the same splits on every run.
    assert_eq!(again.splits, first.splits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_imports_into_the_local_store_resumes_and_is_served() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("my-images");
    let images = image_folder(&src);
    let root = tmp.path().join("store");
    let store = hapi_data::open_bucket(&root.to_string_lossy(), "datasets", true).expect("bucket");
    import_twice(&store, &src, images).await;

    // An interrupted import: one object gone, one cut short; the next run writes those two.
    let listed: Vec<(String, u64)> = keys(&store, "mine")
        .await
        .into_iter()
        .filter(|(k, _)| k != "mine/manifest.json")
        .collect();
    let (gone, cut) = (&listed[0].0, &listed[1].0);
    store
        .delete(&ObjectPath::from(gone.as_str()))
        .await
        .expect("delete");
    store
        .put(&ObjectPath::from(cut.as_str()), b"part".to_vec().into())
        .await
        .expect("put");
    let resumed = import(&store, &opts(vec![src.clone()], "mine"))
        .await
        .expect("resume");
    assert_eq!(
        (resumed.load.written, resumed.load.skipped),
        (2, images - 2)
    );

    // A source already split: val becomes test.
    let split = tmp.path().join("split");
    write(&split.join("train/ant/a.png"), &encode(1, ImageFormat::Png));
    write(&split.join("train/bee/b.png"), &encode(2, ImageFormat::Png));
    write(&split.join("val/ant/c.webp"), &encode(3, ImageFormat::WebP));
    let r = import(&store, &opts(vec![split], "presplit"))
        .await
        .expect("presplit");
    assert_eq!(r.splits.get("train"), Some(&2));
    assert_eq!(r.splits.get("test"), Some(&1));
    assert!(
        keys(&store, "presplit/test/ant").await[0]
            .0
            .ends_with("c.webp"),
        "val -> test"
    );

    // The host reads what was imported, every format (alice may read `mine/` in this policy).
    let text = common::policy_text(&root, &tmp.path().join("state"))
        .replace(r#"prefix = "fashion-mnist/""#, r#"prefix = "mine/""#);
    let h = TestHost::start_with(tempfile::tempdir().expect("tmp"), root.clone(), text).await;
    let mut wanted: Vec<String> = Vec::new();
    for ext in ["png", "jpg", "webp"] {
        let key = listed
            .iter()
            .map(|(k, _)| k)
            .find(|k| k.ends_with(ext) && k != &gone && k != &cut)
            .expect("key");
        wanted.push(key.clone());
    }
    let resp = h
        .warm(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": wanted, "model": "resnet18", "split": 0}),
        )
        .await;
    let (shape, values) = features(resp).await;
    assert_eq!(shape, [3, 3, 224, 224]);
    // Each image's tensor is what the native path makes of the imported bytes.
    let t = hapi_model::ModelPackage::load(
        &hapi_model::models_dir().join("resnet18"),
        tch::Device::Cpu,
    )
    .expect("package")
    .manifest()
    .input
    .transform();
    for (i, key) in wanted.iter().enumerate() {
        let bytes = std::fs::read(root.join("datasets").join(key)).expect("object");
        let native = hapi_preprocess::preprocess(&bytes, &t).expect("native");
        let n = native.len();
        assert_eq!(values[i * n..(i + 1) * n], native[..], "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdataset_shards_import_by_shard_name_and_class() {
    let tmp = tempfile::tempdir().expect("tmp");
    let samples = tmp.path().join("samples");
    for (i, cls) in [(1, "3"), (2, "3"), (3, "12"), (4, "12")] {
        write(
            &samples.join(format!("{i:06}.jpg")),
            &encode(i, ImageFormat::Jpeg),
        );
        write(&samples.join(format!("{i:06}.cls")), cls.as_bytes());
    }
    write(&samples.join("000005.cls"), b"3"); // a class without an image
    let shards = tmp.path().join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let tar = |name: &str, members: &[&str]| make_tar(&shards.join(name), &samples, members);
    tar(
        "data-train-000.tar",
        &[
            "000001.jpg",
            "000001.cls",
            "000002.jpg",
            "000002.cls",
            "000005.cls",
        ],
    );
    tar(
        "data-val-000.tar",
        &["000003.jpg", "000003.cls", "000004.cls", "000004.jpg"],
    );
    let store = hapi_data::open_bucket(
        &tmp.path().join("store").to_string_lossy(),
        "datasets",
        true,
    )
    .expect("bucket");
    let r = import(&store, &opts(vec![shards], "wds"))
        .await
        .expect("import");
    assert_eq!(r.classes, ["0003", "0012"]);
    assert_eq!(r.splits.get("train"), Some(&2));
    assert_eq!(r.splits.get("test"), Some(&2));
    assert_eq!(r.skipped.len(), 1, "{:?}", r.skipped);
    assert!(
        r.skipped[0].path.ends_with("data-train-000.tar:000005"),
        "{:?}",
        r.skipped
    );
    let listed: Vec<String> = keys(&store, "wds")
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        listed,
        [
            "wds/manifest.json",
            "wds/test/0012/000003.jpg",
            "wds/test/0012/000004.jpg",
            "wds/train/0003/000001.jpg",
            "wds/train/0003/000002.jpg",
        ]
    );
    // Read from the shard when written, byte for byte the member.
    for (key, i) in [
        ("wds/test/0012/000004.jpg", 4),
        ("wds/train/0003/000001.jpg", 1),
    ] {
        let stored = store
            .get(&ObjectPath::from(key))
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(
            stored.as_ref(),
            encode(i, ImageFormat::Jpeg).as_slice(),
            "{key}"
        );
    }
}

/// `archive`: a tar of `members` of directory `from`, by the system's `tar`.
fn make_tar(archive: &Path, from: &Path, members: &[&str]) {
    let status = std::process::Command::new("tar")
        .arg("-cf")
        .arg(archive)
        .arg("-C")
        .arg(from)
        .args(members)
        .status()
        .expect("tar");
    assert!(status.success(), "tar -cf {}", archive.display());
}

/// A ustar header block for `name` (`kind` its type flag) with `size` bytes of data.
fn tar_header(name: &str, kind: u8, size: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = kind;
    h[257..265].copy_from_slice(b"ustar\x0000");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Inside a source folder, a symbolic link (here to an image outside it, which the prefix's
/// readers must not get) is not followed, a FIFO not waited on, and a file over
/// `MAX_IMAGE_FILE` not read: each is left out, named, and the rest imported. A shard member
/// whose PAX record claims 2^62 bytes is an error naming the shard. Before: the linked image
/// was stored under the prefix, the FIFO blocked the import forever, and the claimed size was
/// allocated before a byte was read (the process aborted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_fifos_and_oversized_files_are_left_out_unread() {
    use hapi_data::import::MAX_IMAGE_FILE;
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("pets");
    for i in 0..2 {
        write(
            &src.join(format!("cat/cat-{i}.png")),
            &encode(i, ImageFormat::Png),
        );
    }
    let secret = tmp.path().join("private/secret.png");
    write(&secret, &encode(9, ImageFormat::Png));
    std::os::unix::fs::symlink(&secret, src.join("cat/leak.png")).expect("symlink");
    let fifo = std::ffi::CString::new(src.join("cat/pipe.jpg").as_os_str().as_encoded_bytes())
        .expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
    // A sparse file: a PNG's first bytes, then a hole past the bound.
    let big = src.join("cat/big.png");
    write(&big, &encode(3, ImageFormat::Png));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .and_then(|f| f.set_len(MAX_IMAGE_FILE + 1))
        .expect("grow");
    let store = hapi_data::open_bucket(
        &tmp.path().join("store").to_string_lossy(),
        "datasets",
        true,
    )
    .expect("bucket");
    // On a thread of its own: an import blocked on the FIFO (it opened files synchronously)
    // fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let (store2, options) = (Arc::clone(&store), opts(vec![src.clone()], "pets"));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _ = tx.send(rt.block_on(import(&store2, &options)));
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the import waited on the FIFO")
        .expect("import");
    assert_eq!(r.load.written, 2);
    assert_left_out(
        &skipped_reasons(&r),
        &[
            "leak.png: a symbolic link: not followed",
            "pipe.jpg: not a regular file",
            "big.png: 268435457 bytes: larger than",
        ],
    );
    let listed: Vec<String> = keys(&store, "pets")
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(
        listed
            .iter()
            .all(|k| !k.contains("leak") && !k.contains("big")),
        "{listed:?}"
    );

    // A shard: a PAX record giving the next member 2^62 bytes, then that member.
    let mut shard = Vec::new();
    let record = "28 size=4611686018427387904\n";
    assert_eq!(record.len(), 28);
    shard.extend(tar_header(
        "PaxHeaders/000001.jpg",
        b'x',
        record.len() as u64,
    ));
    let mut body = [0u8; 512];
    body[..record.len()].copy_from_slice(record.as_bytes());
    shard.extend(body);
    shard.extend(tar_header("000001.jpg", b'0', 0));
    shard.extend(encode(1, ImageFormat::Jpeg));
    shard.resize(shard.len().next_multiple_of(512) + 1024, 0);
    let path = tmp.path().join("claims-train-000.tar");
    std::fs::write(&path, &shard).expect("write");
    let err = import(&store, &opts(vec![path], "claims"))
        .await
        .expect_err("a member past the end of its shard");
    let err = format!("{err:#}");
    assert!(err.contains("claims-train-000.tar"), "{err}");

    // A shard named on the command line is followed, and split by the name given (a download
    // cache's `*-train-000.tar -> blobs/<digest>`).
    let one = tmp.path().join("one");
    write(&one.join("000001.jpg"), &encode(1, ImageFormat::Jpeg));
    write(&one.join("000001.cls"), b"7");
    std::fs::create_dir_all(tmp.path().join("blobs")).expect("mkdir");
    let blob = tmp.path().join("blobs/5e1f");
    make_tar(&blob, &one, &["000001.jpg", "000001.cls"]);
    let named = tmp.path().join("cache-train-000.tar");
    std::os::unix::fs::symlink(&blob, &named).expect("link");
    let r = import(&store, &opts(vec![named], "cached"))
        .await
        .expect("a shard named through a link");
    assert_eq!(r.splits.get("train"), Some(&1), "{:?}", r.splits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_imports_into_seaweedfs_over_s3_and_resumes() {
    let weed = tokio::task::spawn_blocking(common::seaweed::Seaweed::start)
        .await
        .expect("join");
    // The bucket: a directory of the filer.
    weed.put("datasets", "other/keep.bin", b"x".to_vec()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&weed.s3)
            .with_bucket_name("datasets")
            .with_region("us-east-1")
            .with_access_key_id(common::seaweed::ACCESS_KEY)
            .with_secret_access_key(common::seaweed::SECRET_KEY)
            .with_allow_http(true)
            .build()
            .expect("S3 store"),
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("my-images");
    let images = image_folder(&src);
    import_twice(&store, &src, images).await;
    assert_eq!(keys(&store, "other").await.len(), 1, "other keys untouched");
}
