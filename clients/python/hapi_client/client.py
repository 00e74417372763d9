"""The storage host's HTTP API."""

from __future__ import annotations

import json
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import requests
from requests.adapters import HTTPAdapter
import torch
from safetensors.torch import load as load_safetensors

# Statuses worth retrying: the host is busy (429) or its store is (503), or it is shutting down.
_TRANSIENT = {429, 502, 503, 504}


class HapiError(Exception):
    """The host refused a request, or kept failing past the retry budget.

    ``status`` is the HTTP status (0 when the host could not be reached), ``code`` the host's
    error code (``bad_request``, ``object_not_found``, ...), ``key`` the object at fault when
    the error is about one, and ``request_id`` the host's ``x-request-id`` (its log has the
    details under it).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        key: Optional[str] = None,
        request_id: Optional[str] = None,
    ):
        self.status = status
        self.code = code
        self.message = message
        self.key = key
        self.request_id = request_id
        where = f" (object `{key}`)" if key else ""
        super().__init__(f"{status} {code}: {message}{where}")


@dataclass
class Invocation:
    """One invocation's answer: the ``features`` tensor, the safetensors metadata (function,
    tenant, model, split) and the host's ``Server-Timing`` stages in milliseconds."""

    features: torch.Tensor
    metadata: Dict[str, str] = field(default_factory=dict)
    timing_ms: Dict[str, float] = field(default_factory=dict)


def _metadata(body: bytes) -> Dict[str, str]:
    if len(body) < 8:
        raise HapiError(0, "bad_response", f"{len(body)}-byte body is not safetensors")
    (n,) = struct.unpack("<Q", body[:8])
    if n > len(body) - 8:
        raise HapiError(0, "bad_response", f"safetensors header of {n} bytes is past the body")
    header = json.loads(body[8 : 8 + n])
    return dict(header.get("__metadata__") or {})


def _dequantize(values: torch.Tensor, scales: Optional[torch.Tensor]) -> torch.Tensor:
    """int8 features widened with their scales ``[n, groups]``: one per channel (dimension 1)
    or one per sample (``groups`` = 1)."""
    if scales is None or scales.dim() != 2 or scales.shape[0] != values.shape[0]:
        raise HapiError(0, "bad_response", "int8 `features` without matching `features_scale`")
    n, groups = scales.shape
    if groups == 1:
        shape = [n] + [1] * (values.dim() - 1)
    elif values.dim() >= 2 and values.shape[1] == groups:
        shape = [n, groups] + [1] * (values.dim() - 2)
    else:
        raise HapiError(0, "bad_response", f"{groups} scales per sample for features {list(values.shape)}")
    return values.float() * scales.float().reshape(shape)


def _server_timing(value: Optional[str]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for part in (value or "").split(","):
        name, _, rest = part.strip().partition(";")
        for param in rest.split(";"):
            k, _, v = param.strip().partition("=")
            if k == "dur" and name:
                try:
                    out[name] = float(v)
                except ValueError:
                    pass
    return out


class Client:
    """A tenant's connection to one ``hapi-host``.

    ``url`` is the host's base URL (``http://127.0.0.1:8080``), ``token`` the tenant's bearer
    token. Requests that fail transiently are retried with exponential backoff (honouring
    ``Retry-After``) for up to ``retry_for`` seconds; ``timeout`` bounds each attempt.
    A client holds one HTTP session with up to ``connections`` pooled connections, which
    threads may share; give each process (DataLoader worker) its own.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 300.0,
        retry_for: float = 120.0,
        connections: int = 10,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry_for = retry_for
        self._session = requests.Session()
        self._session.headers["Authorization"] = f"Bearer {token}"
        # Enough pooled connections for `connections` requests at once from several threads.
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=connections)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the API ------------------------------------------------------------------------------

    def invoke(
        self,
        function: str,
        bucket: str,
        keys: Sequence[str],
        *,
        model: Optional[str] = None,
        split: Optional[int] = None,
        options: Optional[Mapping[str, str]] = None,
        quantize: Optional[str] = None,
    ) -> Invocation:
        """Runs ``function`` on ``keys`` of ``bucket`` (``POST /v1/invoke/{function}``).

        ``model`` and ``split`` are for functions that use a model (``feature-extract``
        without ``split`` runs to the model's freeze index); ``options`` are the function's own.
        ``quantize="int8"`` has the host send an f32 output as int8 with per-channel scales
        (about a quarter of the bytes); ``features`` arrives widened to f32.
        """
        body: Dict[str, Any] = {"bucket": bucket, "keys": list(keys)}
        if model is not None:
            body["model"] = model
        if split is not None:
            body["split"] = int(split)
        if options:
            body["options"] = {str(k): str(v) for k, v in options.items()}
        if quantize is not None:
            body["quantize"] = quantize
        resp = self._request("POST", f"/v1/invoke/{function}", json=body)
        tensors = load_safetensors(resp.content)
        if "features" not in tensors:
            raise HapiError(0, "bad_response", f"no `features` tensor in {sorted(tensors)}")
        features = tensors["features"]
        if features.dtype == torch.int8:
            features = _dequantize(features, tensors.get("features_scale"))
        return Invocation(
            features=features,
            metadata=_metadata(resp.content),
            timing_ms=_server_timing(resp.headers.get("server-timing")),
        )

    def models(self) -> List[Dict[str, Any]]:
        """The models this tenant may use (``GET /v1/models``)."""
        return self._request("GET", "/v1/models").json()

    def profile(self, model: str) -> Dict[str, Any]:
        """Per-layer time and output size of ``model`` on the host's device, and its memory
        model (``GET /v1/models/{name}/profile``)."""
        return self._request("GET", f"/v1/models/{model}/profile").json()

    def functions(self) -> List[Dict[str, Any]]:
        """This tenant's functions (``GET /v1/functions``)."""
        return self._request("GET", "/v1/functions").json()

    def deploy(self, name: str, component: Union[bytes, str]) -> Dict[str, Any]:
        """Uploads a Wasm component (bytes, or a path to a ``.wasm`` file) as function
        ``name`` (``PUT /v1/functions/{name}``); returns name, sha256, size."""
        if isinstance(component, str):
            with open(component, "rb") as f:
                component = f.read()
        return self._request("PUT", f"/v1/functions/{name}", data=component).json()

    def undeploy(self, name: str) -> None:
        """Removes function ``name`` (``DELETE /v1/functions/{name}``)."""
        self._request("DELETE", f"/v1/functions/{name}")

    def healthy(self) -> bool:
        """Whether the host answers ``GET /healthz``."""
        try:
            return self._session.get(f"{self.url}/healthz", timeout=10).ok
        except requests.RequestException:
            return False

    # -- transport ----------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        started = time.monotonic()
        backoff = 0.1
        attempts = 0
        while True:
            attempts += 1
            try:
                resp = self._session.request(
                    method, f"{self.url}{path}", timeout=self.timeout, **kwargs
                )
            except requests.RequestException as e:
                resp, last = None, f"{type(e).__name__}: {e}"
            else:
                if resp.ok:
                    return resp
                if resp.status_code not in _TRANSIENT:
                    raise self._error(resp)
                last = str(self._error(resp))
            spent = time.monotonic() - started
            if spent >= self.retry_for:
                raise HapiError(
                    resp.status_code if resp is not None else 0,
                    "gave_up",
                    f"{method} {path} kept failing for {spent:.0f} s "
                    f"({attempts} attempts); last: {last}",
                )
            wait = backoff * (0.5 + random.random())
            if resp is not None and resp.headers.get("retry-after", "").isdigit():
                wait = max(wait, float(resp.headers["retry-after"]))
            time.sleep(min(wait, max(0.0, self.retry_for - spent)))
            backoff = min(backoff * 2, 5.0)

    @staticmethod
    def _error(resp: requests.Response) -> HapiError:
        rid = resp.headers.get("x-request-id")
        try:
            body = resp.json()
            return HapiError(
                resp.status_code,
                str(body.get("code", "unknown")),
                str(body.get("message", "")),
                body.get("key"),
                rid,
            )
        except ValueError:
            return HapiError(resp.status_code, "unknown", resp.text[:400], None, rid)
