"""API keys (``services.gateway.core.auth``): which paths and methods need one, which headers carry
one, and how keys are read from the flag and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.gateway.core.auth import ApiKeys, read_keys

KEYS = ApiKeys(["alpha", "beta"])


def test_without_keys_nothing_is_protected() -> None:
    keys = ApiKeys([])
    assert not keys
    assert not keys.protects("/v1/chat/completions")
    assert not keys.protects_rpc("/inference.GRPCInferenceService/ModelInfer")


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("/v1/chat/completions", True),
        ("/v1/models", True),
        ("/v1/messages", True),
        ("/v1", True),
        ("/health", False),
        ("/live", False),
        ("/metrics", False),
        ("/openapi.json", False),
        ("/v1x", False),
    ],
)
def test_every_v1_route_needs_a_key_and_probes_do_not(path: str, *, protected: bool) -> None:
    assert KEYS.protects(path) is protected


def test_metrics_can_be_protected() -> None:
    assert ApiKeys(["k"], protect_metrics=True).protects("/metrics")
    assert not ApiKeys(["k"], protect_metrics=True).protects("/health")


@pytest.mark.parametrize(
    ("method", "protected"),
    [
        ("/inference.GRPCInferenceService/ModelInfer", True),
        ("/inference.GRPCInferenceService/ModelStreamInfer", True),
        ("/inference.GRPCInferenceService/ModelMetadata", True),
        ("/inference.GRPCInferenceService/ServerLive", False),
        ("/inference.GRPCInferenceService/ServerReady", False),
        ("/grpc.health.v1.Health/Check", False),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", False),
    ],
)
def test_grpc_inference_needs_a_key(method: str, *, protected: bool) -> None:
    assert KEYS.protects_rpc(method) is protected


@pytest.mark.parametrize(
    "headers",
    [
        [(b"authorization", b"Bearer alpha")],
        [(b"authorization", b"bearer beta")],
        [(b"authorization", b"BEARER  alpha ")],
        [(b"x-api-key", b"beta")],
        [(b"content-type", b"application/json"), (b"x-api-key", b"alpha")],
    ],
)
def test_a_known_key_in_either_header_is_allowed(headers: list[tuple[bytes, bytes]]) -> None:
    assert KEYS.allows(headers)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"authorization", b"alpha")],
        [(b"authorization", b"Basic YWxwaGE6")],
        [(b"authorization", b"Bearer alph")],
        [(b"authorization", b"Bearer alphaa")],
        [(b"x-api-key", b"")],
        [(b"x-api-key", b"gamma")],
    ],
)
def test_anything_else_is_refused(headers: list[tuple[bytes, bytes]]) -> None:
    assert not KEYS.allows(headers)


def test_keys_come_from_the_flag_then_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# ops team\nbeta\n\n  gamma  \nalpha\n")
    assert read_keys(" alpha, ,beta", path) == ("alpha", "beta", "gamma")
    assert read_keys("", None) == ()


def test_a_grpc_call_runs_when_it_needs_no_key_or_carries_one() -> None:
    infer = "/inference.GRPCInferenceService/ModelInfer"
    assert KEYS.allows_call("/inference.GRPCInferenceService/ServerLive", [])
    assert KEYS.allows_call(infer, [(b"authorization", b"Bearer beta")])
    assert not KEYS.allows_call(infer, [(b"authorization", b"Bearer nope")])
