"""Samples as ``hapi-train`` sees them: ImageFolder keys, labels by class, seeded subsets."""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Sequence, Tuple

Sample = Tuple[str, int]

_MASK = (1 << 64) - 1


class _SplitMix64:
    """The generator ``hapi-data`` and ``hapi-train`` use, bit for bit."""

    def __init__(self, seed: int):
        self.state = seed & _MASK

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)


def samples_from_keys(keys: Iterable[str], root: str) -> Tuple[List[Sample], List[str]]:
    """``(key, label)`` samples from object keys under ``root`` laid out as
    ``<root>/<class>/<object>`` (ImageFolder), with the sorted class names. Labels are class
    indices in sorted order and keys are sorted within a class, as ``hapi-train`` orders them.
    Keys directly under ``root`` are not samples and are skipped."""
    root = root.strip("/")
    by_class: Dict[str, List[str]] = {}
    for key in keys:
        rest = key[len(root) + 1 :] if key.startswith(root + "/") else None
        if rest is None:
            raise ValueError(f"key `{key}` is outside `{root}/`")
        if "/" not in rest:
            continue
        cls, name = rest.split("/", 1)
        if not name or "/" in name:
            raise ValueError(f"`{key}`: expected `{root}/<class>/<object>` (ImageFolder layout)")
        by_class.setdefault(cls, []).append(key)
    if not by_class:
        raise ValueError(f"no objects under `{root}/<class>/`")
    classes = sorted(by_class)
    samples = [(k, label) for label, c in enumerate(classes) for k in sorted(by_class[c])]
    return samples, classes


def image_folder(store: str, bucket: str, root: str) -> Tuple[List[Sample], List[str]]:
    """Samples of ``<root>/<class>/<object>`` in bucket ``bucket`` of a local store (a
    directory whose subdirectories are buckets, as ``hapi-host`` and ``hapi-train`` take it)."""
    base = os.path.join(store, bucket)
    top = os.path.join(base, root.strip("/"))
    if not os.path.isdir(top):
        raise FileNotFoundError(f"{top} is not a directory: is the data set loaded?")
    keys = []
    for dirpath, _, files in os.walk(top):
        for f in files:
            keys.append(os.path.relpath(os.path.join(dirpath, f), base).replace(os.sep, "/"))
    return samples_from_keys(keys, root)


def seeded_subset(samples: Sequence[Sample], limit: int, seed: int) -> List[Sample]:
    """The ``limit`` samples ``hapi-train --train-limit`` keeps with ``--seed seed`` (for the
    test split, ``hapi-train`` uses ``seed ^ 0x7e57``), in their original order."""
    if limit >= len(samples):
        return list(samples)
    idx = list(range(len(samples)))
    rng = _SplitMix64(seed)
    for i in range(len(idx) - 1, 0, -1):
        j = rng.next_u64() % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return [samples[i] for i in sorted(idx[:limit])]
