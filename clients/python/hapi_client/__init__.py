"""Python client for the HAPI storage tier (``hapi-host``).

- :class:`Client` speaks the host's HTTP API: invoke a pushdown function, list models and
  functions, deploy and remove functions. Transient failures (429, 503, connection errors) are
  retried with backoff; other errors raise :class:`HapiError` with the host's code and message.
- :class:`FeatureDataset` is a PyTorch ``IterableDataset`` that shards a list of
  ``(key, label)`` samples across DataLoader workers (and distributed ranks), keeps several
  requests in flight per worker, and yields ``(features, label)`` per sample.
- :func:`image_folder` lists an ImageFolder layout (``<prefix>/<split>/<class>/<object>``) in
  a local store, and :func:`seeded_subset` picks the same subset as ``hapi-train --train-limit``.
"""

from .client import Client, HapiError, Invocation
from .data import image_folder, samples_from_keys, seeded_subset
from .dataset import FeatureDataset, extract

__all__ = [
    "Client",
    "HapiError",
    "Invocation",
    "FeatureDataset",
    "extract",
    "image_folder",
    "samples_from_keys",
    "seeded_subset",
]
