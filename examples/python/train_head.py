#!/usr/bin/env python3
"""Fine-tune a linear head in PyTorch on features the storage tier computes.

The frozen layers of the model (all but its classifier, up to the package's freeze index) run
on the storage host through the `feature-extract` pushdown function; this script only trains
the head, with an ordinary PyTorch loop over a DataLoader of `hapi_client.FeatureDataset`.
It is `hapi-train --split freeze --cache-features` written with the Python client: the same
samples (the same seeded subsets), the same optimiser (Adam, lr 1e-3), batch size and epochs.
Epoch 1 streams features from the host while it trains and keeps them; later epochs train from
the kept features, shuffled.

    # a host serving the local store (e.g. `cargo xtask demo` leaves one's policy in target/demo)
    PYTHONPATH=clients/python .hapi/venv-torch-2.13.0/bin/python examples/python/train_head.py \\
        --url http://127.0.0.1:8080 --token demo-token --train-limit 5000 --test-limit 2000 --epochs 10
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from hapi_client import Client, FeatureDataset, extract, image_folder, seeded_subset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--token", default="demo-token")
    ap.add_argument("--store", default="data/store", help="local store: a directory of buckets")
    ap.add_argument("--bucket", default="datasets")
    ap.add_argument("--prefix", default="fashion-mnist", help="<prefix>/{train,test}/<class>/<object>")
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--train-limit", type=int)
    ap.add_argument("--test-limit", type=int)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--request-size", type=int, default=8)
    ap.add_argument("--in-flight", type=int, default=4, help="requests outstanding per worker")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args()
    torch.manual_seed(args.seed)

    train, classes = image_folder(args.store, args.bucket, f"{args.prefix}/train")
    test, test_classes = image_folder(args.store, args.bucket, f"{args.prefix}/test")
    if set(test_classes) - set(classes):
        raise SystemExit(f"test classes {test_classes} are not all train classes {classes}")
    test = [(k, classes.index(test_classes[y])) for k, y in test]
    if args.train_limit:
        train = seeded_subset(train, args.train_limit, args.seed)
    if args.test_limit:
        test = seeded_subset(test, args.test_limit, args.seed ^ 0x7E57)

    with Client(args.url, args.token) as client:
        info = next((m for m in client.models() if m["name"] == args.model), None)
        if info is None:
            raise SystemExit(f"the host offers no model `{args.model}` to this tenant")
    print(
        f"{args.model}: {info['layers']} layers, layers [0, {info['freeze_index']}) on the storage "
        f"tier; {len(train)} train / {len(test)} test samples, {len(classes)} classes"
    )

    def dataset(samples, shuffle):
        return FeatureDataset(
            args.url, args.token, args.bucket, samples, model=args.model,
            request_size=args.request_size, in_flight=args.in_flight,
            shuffle=shuffle, seed=args.seed,
        )

    started = time.monotonic()
    stream = dataset(train, shuffle=True)
    loader = torch.utils.data.DataLoader(stream, batch_size=args.batch, num_workers=args.workers)
    head = None
    opt = None
    loss_fn = nn.CrossEntropyLoss()
    kept_x, kept_y = [], []
    test_set = None
    history = []
    for epoch in range(1, args.epochs + 1):
        t0 = time.monotonic()
        if epoch == 1:
            batches = iter(loader)
        else:
            perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed + epoch))
            batches = (
                (train_x[perm[i : i + args.batch]], train_y[perm[i : i + args.batch]])
                for i in range(0, len(perm), args.batch)
            )
        total, n = 0.0, 0
        for x, y in batches:
            x = x.flatten(1)
            if epoch == 1:
                kept_x.append(x)
                kept_y.append(y)
            if head is None:
                head = nn.Linear(x.shape[1], len(classes))
                opt = torch.optim.Adam(head.parameters(), lr=args.lr)
            loss = loss_fn(head(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            n += len(y)
        if epoch == 1:
            train_x, train_y = torch.cat(kept_x), torch.cat(kept_y)
            test_set = extract(dataset(test, shuffle=False), workers=args.workers)
        with torch.no_grad():
            pred = head(test_set["features"].flatten(1)).argmax(1)
            acc = (pred == test_set["labels"]).float().mean().item()
        secs = time.monotonic() - t0
        history.append({"epoch": epoch, "loss": total / max(n, 1), "test_accuracy": acc, "seconds": secs})
        print(f"epoch {epoch}: loss {total / max(n, 1):.4f}, test accuracy {100 * acc:.1f}%, {secs:.1f} s")
    best = max(h["test_accuracy"] for h in history)
    print(
        f"final test accuracy {100 * history[-1]['test_accuracy']:.1f}% (best {100 * best:.1f}%), "
        f"{time.monotonic() - started:.1f} s"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "train": len(train), "test": len(test), "epochs": history}, f, indent=1)


if __name__ == "__main__":
    main()
