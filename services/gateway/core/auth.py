"""API keys (``--api-key``, ``--api-key-file``): which requests need one and whether a request
carries one of them. Pure: headers in, a verdict out.

Inference and listing (every ``/v1`` route over HTTP, the KServe ``GRPCInferenceService`` over
gRPC) need a key; probes (``/health``, ``/live``, KServe's ``ServerLive`` / ``ServerReady``),
``/metrics`` (unless ``--protect-metrics``), the OpenAPI document, gRPC health and reflection do
not. A key comes as ``Authorization: Bearer
<key>`` (OpenAI's clients, gRPC metadata ``authorization``) or ``x-api-key: <key>`` (Anthropic's
clients). Keys are compared in constant time, every configured key each time, and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ApiKeys", "read_keys"]

GRPC_PROTECTED_PREFIX = "/inference.GRPCInferenceService/"
GRPC_PROBES = frozenset(
    {"/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/ServerReady"}
)
"""KServe's own liveness and readiness probes stay open, as ``/health`` and ``/live`` do."""
_BEARER = b"bearer "


def read_keys(listed: str, path: Path | None) -> tuple[str, ...]:
    """The keys of ``--api-key`` (comma-separated) and of ``--api-key-file`` (one per line;
    blank lines and ``#`` comments skipped), in that order, without duplicates."""
    keys = [k.strip() for k in listed.split(",")]
    if path is not None:
        lines = path.read_text(encoding="utf-8").splitlines()
        keys += [line.strip() for line in lines if not line.strip().startswith("#")]
    return tuple(dict.fromkeys(k for k in keys if k))


class ApiKeys:
    """The configured keys; with none, nothing is protected."""

    __slots__ = ("_keys", "_metrics_path", "_protect_metrics", "_protected")

    def __init__(
        self,
        keys: Iterable[str],
        *,
        protect_metrics: bool = False,
        protected: frozenset[str] = frozenset(),
        metrics_path: str = "/metrics",
    ) -> None:
        self._keys = tuple(k.encode() for k in keys)
        self._protect_metrics = protect_metrics
        self._protected = protected
        """Paths outside ``/v1`` that need a key too (inference and models moved by settings);
        one ending in ``/``: every path under it."""
        self._metrics_path = metrics_path

    def __bool__(self) -> bool:
        return bool(self._keys)

    def protects(self, path: str) -> bool:
        """Whether an HTTP request to ``path`` needs a key."""
        if not self._keys:
            return False
        if path == "/v1" or path.startswith("/v1/") or path in self._protected:
            return True
        if any(p.endswith("/") and path.startswith(p) for p in self._protected):
            return True
        return self._protect_metrics and path == self._metrics_path

    def protects_rpc(self, method: str) -> bool:
        """Whether a gRPC call of ``method`` (``/package.Service/Method``) needs a key."""
        return (
            bool(self._keys)
            and method.startswith(GRPC_PROTECTED_PREFIX)
            and method not in GRPC_PROBES
        )

    def allows_call(self, method: str, metadata: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a gRPC call of ``method`` may run: it needs no key, or carries one."""
        return not self.protects_rpc(method) or self.allows(metadata)

    def allows(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether ``headers`` (lower-case names, ASGI or HTTP/2 style) carry a valid key."""
        for name, value in headers:
            if name == b"authorization" and value[:7].lower() == _BEARER:
                if self._known(value[7:].strip()):
                    return True
            elif name == b"x-api-key" and self._known(value.strip()):
                return True
        return False

    def _known(self, candidate: bytes) -> bool:
        found = False
        for key in self._keys:  # every key, so the time does not say which one matched
            found |= hmac.compare_digest(candidate, key)
        return found
