//! Loading data sets into a real local object store.

use futures::TryStreamExt;
use hapi_data::{fashion_mnist, open_store, photos};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeMap;

fn fashion_source() -> std::path::PathBuf {
    std::env::var_os("HAPI_FASHION_MNIST")
        .map_or_else(|| fashion_mnist::DEFAULT_SOURCE.into(), Into::into)
}

async fn keys(store: &dyn ObjectStore, prefix: &Path) -> Vec<Path> {
    let mut keys: Vec<Path> = store
        .list(Some(prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .expect("list");
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fashion_mnist_loads_70000_labelled_objects_that_decode_to_the_source_pixels() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = open_store(tmp.path().to_str().expect("utf-8")).expect("store");
    let prefix = Path::from("fmnist");
    let source = fashion_source();

    let report = fashion_mnist::load(&store, &prefix, &source)
        .await
        .expect("load");
    assert_eq!(report.written, 70_000);
    assert_eq!(report.skipped, 0);

    // Objects per (split, class) equal the labels in the source files.
    let mut counted: BTreeMap<(String, String), usize> = BTreeMap::new();
    for key in keys(store.as_ref(), &prefix).await {
        let segs: Vec<String> = key.parts().map(|p| p.as_ref().to_string()).collect();
        if segs.len() == 2 {
            assert_eq!(segs[1], "manifest.json");
            continue;
        }
        assert_eq!(segs.len(), 4, "{key}");
        *counted
            .entry((segs[1].clone(), segs[2].clone()))
            .or_default() += 1;
    }
    for (split, stem) in fashion_mnist::SPLITS {
        let data = fashion_mnist::read_split(&source, stem).expect("source");
        for (label, class) in fashion_mnist::CLASSES.iter().enumerate() {
            let expected = data
                .labels
                .iter()
                .filter(|&&l| usize::from(l) == label)
                .count();
            assert_eq!(
                counted.get(&(split.to_string(), class.to_string())),
                Some(&expected),
                "{split}/{class}"
            );
        }
        // Objects read back decode to the same pixels as the source file, under their label.
        for i in [0, 1, 4321, data.len() - 1] {
            let key = fashion_mnist::key(&prefix, split, data.labels[i], i);
            let bytes = store
                .get(&key)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes");
            let img = image::load_from_memory(&bytes).expect("png").to_luma8();
            assert_eq!(img.dimensions(), (28, 28));
            assert_eq!(img.as_raw().as_slice(), data.image(i), "{key}");
        }
    }
    let manifest: hapi_data::DatasetManifest = serde_json::from_slice(
        &store
            .get(&prefix.clone().join("manifest.json"))
            .await
            .expect("manifest")
            .bytes()
            .await
            .expect("bytes"),
    )
    .expect("manifest json");
    assert_eq!(
        manifest.splits,
        [("train".to_string(), 60_000), ("test".to_string(), 10_000)]
    );

    // A second run finds everything and writes nothing.
    let again = fashion_mnist::load(&store, &prefix, &source)
        .await
        .expect("reload");
    assert_eq!((again.written, again.skipped), (0, 70_000));
}

#[tokio::test]
async fn a_missing_or_corrupt_source_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let err = fashion_mnist::read_split(tmp.path(), "train").expect_err("missing");
    assert!(
        format!("{err:#}").contains("train-images-idx3-ubyte.gz"),
        "{err:#}"
    );

    std::fs::write(tmp.path().join("train-images-idx3-ubyte.gz"), b"not gzip").expect("write");
    std::fs::write(tmp.path().join("train-labels-idx1-ubyte.gz"), b"not gzip").expect("write");
    let err = fashion_mnist::read_split(tmp.path(), "train").expect_err("corrupt");
    assert!(format!("{err:#}").contains("decompressing"), "{err:#}");
}

fn photos_dir() -> std::path::PathBuf {
    std::env::var_os("HAPI_PHOTOS").map_or_else(
        || {
            // The run-time value first: clones sharing a build directory share this binary.
            std::env::var_os("CARGO_MANIFEST_DIR")
                .map_or_else(
                    || env!("CARGO_MANIFEST_DIR").into(),
                    std::path::PathBuf::from,
                )
                .join("../.hapi/photos")
        },
        Into::into,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn photos_are_imagenet_like_jpegs_labelled_by_source_and_reproducible() {
    let count = 45; // three per source photo
    let opts = photos::Options {
        count,
        ..photos::Options::default()
    };
    let (a, b) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let store_a = open_store(a.path().to_str().expect("utf-8")).expect("store");
    let store_b = open_store(b.path().to_str().expect("utf-8")).expect("store");
    let prefix = Path::from("photos");
    let report = photos::load(&store_a, &prefix, &photos_dir(), opts)
        .await
        .expect("load");
    assert_eq!(report.written, count);
    photos::load(&store_b, &prefix, &photos_dir(), opts)
        .await
        .expect("load again");

    let mut sizes = Vec::new();
    for i in 0..count {
        let key = photos::key(&prefix, i);
        let class = key.parts().nth(2).expect("class").as_ref().to_string();
        assert_eq!(
            class,
            photos::SOURCES[i % 15].split('.').next().expect("stem")
        );
        let bytes = store_a
            .get(&key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        let same = store_b
            .get(&key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(bytes, same, "{key}: the data set is not deterministic");
        assert_eq!(
            image::guess_format(&bytes).expect("format"),
            image::ImageFormat::Jpeg
        );
        let img = image::load_from_memory(&bytes).expect("decode");
        assert!(
            matches!((img.width(), img.height()), (500, 375) | (375, 500)),
            "{key}"
        );
        sizes.push(bytes.len());
    }
    let mean = sizes.iter().sum::<usize>() / sizes.len();
    println!("mean object size {mean} bytes");
    assert!(
        (40_000..200_000).contains(&mean),
        "mean object size {mean} bytes is not ImageNet-like"
    );
}
