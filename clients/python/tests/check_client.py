"""Exercises hapi_client against a running host; `host/tests/python_client.rs` runs it.

Usage: check_client.py URL TOKEN SPEC OUT_DIR, where SPEC is a JSON file with `bucket`, `keys`
(readable images), `missing` (a key with no object) and `corrupt` (a key that is no image).
Writes OUT_DIR/features.safetensors (the client's features for `keys`, resnet18 split 2) and
prints one JSON line of findings, which the Rust test asserts on.
"""

import json
import sys
import warnings

import torch
from safetensors.torch import save_file

from hapi_client import Client, FeatureDataset, HapiError, samples_from_keys, seeded_subset


def main() -> None:
    url, token, spec_path, out = sys.argv[1:5]
    spec = json.load(open(spec_path))
    bucket, keys = spec["bucket"], spec["keys"]
    found = {}
    with Client(url, token) as c:
        found["healthy"] = c.healthy()
        found["models"] = sorted(m["name"] for m in c.models())
        found["functions"] = sorted(f["name"] for f in c.functions())
        inv = c.invoke("feature-extract", bucket, keys, model="resnet18", split=2)
        found["shape"] = list(inv.features.shape)
        found["metadata"] = inv.metadata
        found["timing_stages"] = sorted(inv.timing_ms)
        save_file({"features": inv.features.contiguous()}, f"{out}/features.safetensors")
        # int8 on the wire: widened to f32, each sample within half its coarsest step.
        q = c.invoke("feature-extract", bucket, keys, model="resnet18", split=2, quantize="int8")
        found["int8_dtype"] = str(q.features.dtype)
        found["int8_within_half_a_step"] = all(
            (q.features[i] - inv.features[i]).abs().max().item()
            <= inv.features[i].abs().max().item() / 254 * 1.001
            for i in range(len(keys))
        )
        try:
            c.invoke("feature-extract", bucket, keys[:1] + [spec["missing"]], model="resnet18", split=2)
            found["missing"] = None
        except HapiError as e:
            found["missing"] = {"status": e.status, "code": e.code, "key": e.key}
        try:
            c.invoke("feature-extract", bucket, keys[:1], options={"colour": "blue"}, model="resnet18")
            found["bad_option"] = None
        except HapiError as e:
            found["bad_option"] = {"status": e.status, "code": e.code, "message": e.message}

    # The dataset: every sample exactly once over two DataLoader workers, each with two requests
    # of two keys in flight; labels here are sample indices, so rows can be matched to keys.
    samples = [(k, i) for i, k in enumerate(keys)]
    ds = FeatureDataset(url, token, bucket, samples, model="resnet18", split=2,
                        request_size=2, in_flight=2, shuffle=True, seed=7)
    ds.set_epoch(3)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    rows = {}
    for x, y in loader:
        for xi, yi in zip(x, y.tolist()):
            assert yi not in rows, f"sample {yi} yielded twice"
            rows[yi] = xi
    found["dataset_labels"] = sorted(rows)
    found["dataset_equal"] = all(torch.equal(rows[i], inv.features[i]) for i in range(len(keys)))

    # skip_bad: the corrupt object is left out with a warning; the others are yielded.
    bad = samples + [(spec["corrupt"], len(keys))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [y for _, y in FeatureDataset(url, token, bucket, bad, model="resnet18", split=2,
                                            request_size=4, skip_bad=True)]
    found["skip_bad_labels"] = sorted(got)
    found["skip_bad_warnings"] = [str(w.message) for w in caught]
    try:
        list(FeatureDataset(url, token, bucket, bad, model="resnet18", split=2, request_size=4))
        found["strict"] = None
    except HapiError as e:
        found["strict"] = {"code": e.code, "key": e.key}

    # ImageFolder listing and hapi-train's seeded subset.
    listed, classes = samples_from_keys(keys, spec["root"])
    found["classes"] = classes
    found["listed"] = [k for k, _ in listed]
    found["subset"] = [k for k, _ in seeded_subset(listed, 3, 0)]
    print(json.dumps(found))


if __name__ == "__main__":
    main()
