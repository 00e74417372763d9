"""A PyTorch ``IterableDataset`` over the storage tier's features."""

from __future__ import annotations

import collections
import random
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .client import Client, HapiError

# Object errors a job may choose to skip: the object, not the request, is at fault.
_OBJECT_CODES = {"bad_object", "object_not_found", "object_too_large"}


class FeatureDataset(IterableDataset):
    """Yields ``(features, label)`` for each ``(key, label)`` sample, with the features computed
    on the storage tier by ``function`` (default ``feature-extract``: layers ``[0, split)`` of
    ``model``; without ``split``, up to the model's freeze index).

    The samples are sharded across DataLoader workers and, when ``torch.distributed`` is
    initialised, across ranks: every sample is yielded once per epoch by exactly one worker.
    Each worker opens its own :class:`Client`, sends ``request_size`` keys per request and keeps
    ``in_flight`` requests outstanding, so the host's pipeline stays full while the training
    loop runs. With ``shuffle``, the order changes every epoch (call :meth:`set_epoch`) and is
    the same for a given ``seed`` and epoch. With ``skip_bad``, an object the host cannot read
    or decode is left out with a warning instead of failing the epoch.
    """

    def __init__(
        self,
        url: str,
        token: str,
        bucket: str,
        samples: Sequence[Tuple[str, int]],
        *,
        function: str = "feature-extract",
        model: Optional[str] = None,
        split: Optional[int] = None,
        options: Optional[Mapping[str, str]] = None,
        quantize: Optional[str] = None,
        request_size: int = 8,
        in_flight: int = 4,
        shuffle: bool = False,
        seed: int = 0,
        skip_bad: bool = False,
        retry_for: float = 120.0,
    ):
        super().__init__()
        if request_size < 1 or in_flight < 1:
            raise ValueError("request_size and in_flight must be at least 1")
        self.url, self.token, self.bucket = url, token, bucket
        self.samples = list(samples)
        self.function, self.model, self.split = function, model, split
        self.options = dict(options or {})
        self.quantize = quantize
        self.request_size, self.in_flight = request_size, in_flight
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.skip_bad, self.retry_for = skip_bad, retry_for

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order (with ``shuffle``); call before iterating."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.samples)

    def _shard(self) -> List[Tuple[str, int]]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        ranks, rank = 1, 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ranks, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        shards, shard = ranks * workers, rank * workers + worker
        return [self.samples[i] for i in order[shard::shards]]

    def _fetch(self, client: Client, chunk: List[Tuple[str, int]]):
        chunk = list(chunk)
        while chunk:
            try:
                out = client.invoke(
                    self.function,
                    self.bucket,
                    [k for k, _ in chunk],
                    model=self.model,
                    split=self.split,
                    options=self.options,
                    quantize=self.quantize,
                )
            except HapiError as e:
                bad = [s for s in chunk if s[0] == e.key]
                if not (self.skip_bad and e.code in _OBJECT_CODES and bad):
                    raise
                warnings.warn(f"skipping `{e.key}`: {e.message}")
                chunk = [s for s in chunk if s[0] != e.key]
                continue
            if out.features.shape[0] != len(chunk):
                raise HapiError(
                    0,
                    "bad_response",
                    f"{self.function} returned {out.features.shape[0]} rows for {len(chunk)} keys",
                )
            return out.features, [label for _, label in chunk]
        return None, []

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, int]]:
        mine = self._shard()
        chunks = [mine[i : i + self.request_size] for i in range(0, len(mine), self.request_size)]
        client = Client(
            self.url, self.token, retry_for=self.retry_for, connections=self.in_flight
        )
        pending: Deque[Future] = collections.deque()
        with client, ThreadPoolExecutor(max_workers=self.in_flight) as pool:
            it = iter(chunks)
            try:
                for chunk in it:
                    pending.append(pool.submit(self._fetch, client, chunk))
                    if len(pending) >= self.in_flight:
                        yield from self._rows(pending.popleft())
                while pending:
                    yield from self._rows(pending.popleft())
            finally:
                for f in pending:
                    f.cancel()

    @staticmethod
    def _rows(future: Future) -> Iterator[Tuple[torch.Tensor, int]]:
        features, labels = future.result()
        if features is not None and features.is_floating_point():
            # f16/bf16 on the wire (options={"dtype": "f16"}) halve the bytes, int8
            # (quantize="int8") quarters them; training sees f32.
            features = features.float()
        for i, label in enumerate(labels):
            yield features[i], label


def extract(dataset: FeatureDataset, workers: int = 0) -> Dict[str, torch.Tensor]:
    """Every sample's features and label, in one pass: ``{"features": [N, ...], "labels": [N]}``
    (in the order the workers delivered them)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=256, num_workers=workers)
    feats, labels = [], []
    for x, y in loader:
        feats.append(x)
        labels.append(y)
    return {"features": torch.cat(feats), "labels": torch.cat(labels)}
