"""The KServe v2 / Triton gRPC front end end to end, driven by the stock ``tritonclient[grpc]``.

``tritonclient.grpc`` and ``shared.kserve`` register the same protobuf names, and a whole-suite
run imports ``shared.kserve`` (unit and integration tiers) into this process. So each
``@client_test`` body runs in one fresh interpreter per module, this module run as
``__main__`` (``ClientProcess``), the only place ``tritonclient`` is imported; its traceback
comes back as the test's failure. Health and reflection need no ``inference.*`` types and run
here. HTTP answers for the same requests come from the ``openai`` client.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import grpc
import numpy as np
import openai
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # type: ignore[import-untyped]
    ProtoReflectionDescriptorDatabase,
)

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL, TENSOR_MODEL, running_stack
from tests.support import eventually

if __name__ == "__main__":  # the client process only (see the module docstring)
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import model_config_pb2
    from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[2]
CLIENT_MODULE = "tests.e2e.test_grpc"
SERVICE = "inference.GRPCInferenceService"
RPCS = {
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
    "ModelConfig",
}
CHECK_TIMEOUT_S = 60.0
WAIT_S = 30.0


# --- the client process ------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a check knows about the stack it talks to (sent as JSON to the client process)."""

    grpc_address: str
    base_url: str


Check = Callable[[Target], None]
CHECKS: dict[str, Check] = {}


class ClientProcess:
    """This module as ``__main__`` in a fresh interpreter: runs checks by name, one at a time."""

    def __init__(self) -> None:
        self._proc = self._start()

    @staticmethod
    def _start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", CLIENT_MODULE],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, check: Check, stack: Stack, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """Run ``check`` against ``stack`` there; its failure (a traceback) fails the test."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        target = Target(grpc_address=stack.grpc_address, base_url=stack.base_url)
        self._proc.stdin.write(json.dumps({"check": check.__name__, "target": asdict(target)}))
        self._proc.stdin.write("\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            code = self._proc.poll()
            self.close()
            self._proc = self._start()  # the next check gets a process in a known state
            pytest.fail(f"the client process gave no answer in {timeout_s}s (exit code {code})")
        reply = json.loads(line)
        if not reply["ok"]:
            pytest.fail(f"{reply['error']}\n{_log_tails(stack)}", pytrace=False)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def client_check(check: Check) -> Check:
    """Make ``check`` runnable in the client process (by its name)."""
    CHECKS[check.__name__] = check
    return check


def client_test(check: Check) -> Callable[[ClientProcess, Stack], None]:
    """A pytest test that runs ``check`` in the client process against ``grpc_stack``."""
    client_check(check)

    def test(triton: ClientProcess, grpc_stack: Stack) -> None:
        triton.run(check, grpc_stack)

    # No functools.wraps: pytest would read the check's signature through __wrapped__.
    test.__name__ = test.__qualname__ = check.__name__
    test.__doc__ = check.__doc__
    return test


def _serve_checks(requests: IO[str]) -> None:
    """The client process: one JSON request per line in, one JSON reply per line out."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the replies
    for line in requests:
        request = json.loads(line)
        try:
            CHECKS[request["check"]](Target(**request["target"]))
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        else:
            reply = {"ok": True}
        replies.write(json.dumps(reply) + "\n")


def _log_tails(stack: Stack) -> str:
    return "\n".join(
        f"--- {c.name}\n{c.tail(20)}"
        for c in stack.children
        if c.name.startswith(("gateway", "mocker", "echo_tensor"))
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[ClientProcess]:
    """The client process for this module's checks."""
    process = ClientProcess()
    try:
        yield process
    finally:
        process.close()


# --- helpers for the checks (client process) ---------------------------------------------------


def _client(target: Target) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(target.grpc_address)


def _http(target: Target) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{target.base_url}/v1", api_key="unused", max_retries=0)


def _tensor(name: str, datatype: str, values: np.ndarray) -> grpcclient.InferInput:
    return grpcclient.InferInput(name, list(values.shape), datatype).set_data_from_numpy(values)


def _prompt(text: str, streaming: bool | None = None) -> list[grpcclient.InferInput]:
    """``text_input`` (and ``streaming`` when given), as the seed's LLM metadata says."""
    inputs = [_tensor("text_input", "BYTES", np.array([text.encode()], dtype=np.object_))]
    if streaming is not None:
        inputs.append(_tensor("streaming", "BOOL", np.array([streaming])))
    return inputs


def _text_of(result: grpcclient.InferResult, name: str) -> str | None:
    values = result.as_numpy(name)
    return None if values is None else b"".join(values.ravel()).decode()


def _completion(target: Target, prompt: str, params: dict[str, Any]) -> tuple[str, str, int]:
    """The same request over HTTP ``/v1/completions``: text, finish reason, completion tokens."""
    knobs = {k: v for k, v in params.items() if k != "ignore_eos"}
    with _http(target) as http:
        resp = http.completions.create(
            model=MODEL,
            prompt=prompt,
            extra_body={"ignore_eos": params.get("ignore_eos", False)},
            **knobs,
        )
    assert resp.usage is not None
    choice = resp.choices[0]
    return choice.text, str(choice.finish_reason), resp.usage.completion_tokens


def _status_of(call: Callable[[], object]) -> str:
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status())
    return "OK"


# --- health, metadata, config ------------------------------------------------------------------


@client_test
def test_server_and_both_models_are_live_and_ready(target: Target) -> None:
    with _client(target) as client:
        answers = (
            client.is_server_live(),
            client.is_server_ready(),
            client.is_model_ready(MODEL),
            client.is_model_ready(TENSOR_MODEL),
            client.is_model_ready("no-such-model"),
        )
    assert answers == (True, True, True, True, False), answers


@client_test
def test_server_metadata_names_the_server_and_its_extensions(target: Target) -> None:
    with _client(target) as client:
        meta = client.get_server_metadata()
    assert meta.name == "jetserve", meta
    assert meta.version, meta
    assert {"model_configuration", "parameters"} <= set(meta.extensions), meta


@client_test
def test_llm_metadata_has_text_input_streaming_text_output_finish_reason(target: Target) -> None:
    with _client(target) as client:
        meta = client.get_model_metadata(MODEL)
    got = (
        meta.name,
        list(meta.versions),
        [(t.name, t.datatype, list(t.shape)) for t in meta.inputs],
        [(t.name, t.datatype, list(t.shape)) for t in meta.outputs],
    )
    want = (
        MODEL,
        ["1"],
        [("text_input", "BYTES", [1]), ("streaming", "BOOL", [1])],
        [("text_output", "BYTES", [-1]), ("finish_reason", "BYTES", [-1])],
    )
    assert got == want, f"{got} != {want}"


@client_test
def test_llm_config_marks_streaming_optional(target: Target) -> None:
    with _client(target) as client:
        config = client.get_model_config(MODEL).config
    type_name = model_config_pb2.DataType.Name
    got = (
        config.name,
        [(i.name, type_name(i.data_type), list(i.dims), i.optional) for i in config.input],
        [(o.name, type_name(o.data_type), list(o.dims)) for o in config.output],
    )
    want = (
        MODEL,
        [("text_input", "TYPE_STRING", [1], False), ("streaming", "TYPE_BOOL", [1], True)],
        [("text_output", "TYPE_STRING", [-1]), ("finish_reason", "TYPE_STRING", [-1])],
    )
    assert got == want, f"{got} != {want}"


@client_test
def test_echo_metadata_and_config_give_the_workers_tensors(target: Target) -> None:
    with _client(target) as client:
        meta = client.get_model_metadata(TENSOR_MODEL)
        config = client.get_model_config(TENSOR_MODEL).config
    got = (
        [(t.name, t.datatype, list(t.shape)) for t in meta.inputs],
        [(t.name, t.datatype, list(t.shape)) for t in meta.outputs],
        [(i.name, i.optional) for i in config.input],
        config.max_batch_size,
    )
    want = (
        [("INPUT0", "INT32", [-1]), ("INPUT1", "FP32", [-1]), ("INPUT2", "BYTES", [-1])],
        [("OUTPUT0", "INT32", [-1]), ("OUTPUT1", "FP32", [-1]), ("OUTPUT2", "BYTES", [-1])],
        [("INPUT0", True), ("INPUT1", True), ("INPUT2", True)],
        0,
    )
    assert got == want, f"{got} != {want}"


# --- inference ---------------------------------------------------------------------------------

UNARY_PARAMS = {"max_tokens": 12, "ignore_eos": True, "seed": 3, "temperature": 0.0, "top_p": 0.9}


@client_test
def test_model_infer_matches_the_same_completion_over_http(target: Target) -> None:
    """Text, finish reason and token count equal HTTP's (sampling knobs as parameters)."""
    prompt = "Once upon a time"
    with _client(target) as client:
        result = client.infer(MODEL, _prompt(prompt), parameters=UNARY_PARAMS)
    reported = result.get_response().parameters
    got = (_text_of(result, "text_output"), _text_of(result, "finish_reason"))
    text, finish, completion_tokens = _completion(target, prompt, UNARY_PARAMS)
    assert got == (text, finish), f"gRPC {got} != HTTP {(text, finish)}"
    assert (finish, completion_tokens) == ("length", UNARY_PARAMS["max_tokens"])
    assert reported["completion_tokens"].int64_param == completion_tokens, reported
    assert reported["prompt_tokens"].int64_param > 0, reported


@client_test
def test_sampling_knobs_as_inputs_act_as_on_http(target: Target) -> None:
    """``max_tokens``, ``ignore_eos``, ``seed`` and ``temperature`` as optional input tensors."""
    prompt = "Once upon a time"
    knobs = {"max_tokens": 12, "ignore_eos": True, "seed": 3, "temperature": 0.0}
    inputs = [
        _tensor("max_tokens", "INT32", np.array([knobs["max_tokens"]], dtype=np.int32)),
        _tensor("ignore_eos", "BOOL", np.array([knobs["ignore_eos"]])),
        _tensor("seed", "INT64", np.array([knobs["seed"]], dtype=np.int64)),
        _tensor("temperature", "FP32", np.array([knobs["temperature"]], dtype=np.float32)),
    ]
    with _client(target) as client:
        result = client.infer(MODEL, _prompt(prompt) + inputs)
    got = (_text_of(result, "text_output"), _text_of(result, "finish_reason"))
    want = _completion(target, prompt, knobs)[:2]
    assert got == want, f"gRPC {got} != HTTP {want}"


def _stream_params(i: int) -> dict[str, Any]:
    """Even requests run to ``max_tokens``; odd ones, allowed 2000 tokens, end at EOS."""
    if i % 2 == 0:
        return {"max_tokens": 8 + 4 * i, "ignore_eos": True, "temperature": 0.0}
    return {"max_tokens": 2000, "temperature": 0.0, "seed": i}


@client_test
def test_sixteen_concurrent_requests_on_one_stream_match_http(target: Target) -> None:
    """Deltas collected by request id add up to HTTP's text; the final one has its finish and
    token count."""
    prompts = {f"req-{i}": f"Question {i}: what lies beyond the hills?" for i in range(16)}
    texts: dict[str, list[str]] = {rid: [] for rid in prompts}
    finishes: dict[str, str] = {}
    counts: dict[str, int] = {}
    final_flags: list[bool] = []
    partial_flags: list[bool] = []
    errors: list[str] = []
    all_final = threading.Event()

    def on_response(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        if error is not None or result is None:
            errors.append(str(error))
            all_final.set()
            return
        response = result.get_response()
        if (delta := _text_of(result, "text_output")) is not None:
            texts[response.id].append(delta)
        flag = response.parameters.get("triton_final_response")
        if (finish := _text_of(result, "finish_reason")) is None:
            partial_flags.append(flag is not None and not flag.bool_param)
        else:
            final_flags.append(flag is not None and flag.bool_param)
            finishes[response.id] = finish
            counts[response.id] = response.parameters["completion_tokens"].int64_param
            if len(finishes) == len(prompts):
                all_final.set()

    with _client(target) as client:
        client.start_stream(callback=on_response)
        for i, (rid, prompt) in enumerate(prompts.items()):
            client.async_stream_infer(
                MODEL, _prompt(prompt, streaming=True), request_id=rid, parameters=_stream_params(i)
            )
        is_done = all_final.wait(WAIT_S)
        client.stop_stream(cancel_requests=not is_done)
    assert not errors, errors
    assert is_done, f"final responses for {sorted(finishes)} only"
    assert final_flags == [True] * len(prompts)  # Triton's flag on every last response
    assert partial_flags
    assert all(partial_flags)  # … and false on every other one
    got = {rid: ("".join(texts[rid]), finishes[rid], counts[rid]) for rid in prompts}
    want = {
        rid: _completion(target, prompt, _stream_params(i))
        for i, (rid, prompt) in enumerate(prompts.items())
    }
    assert got == want, {rid: (got[rid], want[rid]) for rid in prompts if got[rid] != want[rid]}
    assert {finish for _, finish, _ in got.values()} == {"length", "stop"}


@client_test
def test_a_failed_request_on_a_stream_is_an_error_and_the_stream_goes_on(target: Target) -> None:
    results: list[tuple[str | None, str | None]] = []
    two_answers = threading.Event()

    def on_response(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        finish = None if result is None else _text_of(result, "finish_reason")
        if error is not None or finish is not None:
            results.append((None if error is None else str(error), finish))
        if len(results) == 2:
            two_answers.set()

    with _client(target) as client:
        client.start_stream(callback=on_response)
        client.async_stream_infer("no-such-model", _prompt("hi"), request_id="bad")
        client.async_stream_infer(
            MODEL, _prompt("hi"), request_id="good", parameters={"max_tokens": 2}
        )
        is_done = two_answers.wait(WAIT_S)
        client.stop_stream(cancel_requests=not is_done)
    assert is_done, results
    assert sorted(results, key=str) == sorted(
        [("The model `no-such-model` does not exist.", None), (None, "length")], key=str
    ), results


@client_test
def test_echo_round_trips_int32_fp32_and_bytes_tensors(target: Target) -> None:
    sent = {
        "INPUT0": np.array([1, -2, 2**31 - 1, -(2**31)], dtype=np.int32),
        "INPUT1": np.array([0.5, -1.25, 3.0e38, np.inf], dtype=np.float32),
        "INPUT2": np.array([b"a", b"", "\u00e9t\u00e9".encode(), b"\x00\xff"], dtype=np.object_),
    }
    datatypes = {"INPUT0": "INT32", "INPUT1": "FP32", "INPUT2": "BYTES"}
    inputs = [_tensor(name, datatypes[name], values) for name, values in sent.items()]
    with _client(target) as client:
        result = client.infer(TENSOR_MODEL, inputs)
    for i, (name, values) in enumerate(sent.items()):
        got = result.as_numpy(f"OUTPUT{i}")
        assert got is not None, f"no OUTPUT{i}"
        assert got.dtype == values.dtype, (name, got.dtype)
        np.testing.assert_array_equal(got, values)


@client_test
def test_echo_gives_only_the_requested_outputs(target: Target) -> None:
    values = np.array([7, 8], dtype=np.int32)
    inputs = [
        _tensor("INPUT0", "INT32", values),
        _tensor("INPUT1", "FP32", np.array([1.5], dtype=np.float32)),
    ]
    with _client(target) as client:
        result = client.infer(
            TENSOR_MODEL, inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0")]
        )
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT0"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


# --- errors ------------------------------------------------------------------------------------


@client_test
def test_bad_requests_get_the_kserve_status_codes(target: Target) -> None:
    as_int32 = _tensor("text_input", "INT32", np.array([1], dtype=np.int32))
    with _client(target) as client:
        got = {
            "unknown model": _status_of(lambda: client.infer("no-such-model", _prompt("hi"))),
            "unknown model metadata": _status_of(
                lambda: client.get_model_metadata("no-such-model")
            ),
            "missing text_input": _status_of(
                lambda: client.infer(MODEL, [_tensor("streaming", "BOOL", np.array([False]))])
            ),
            "text_input as INT32": _status_of(lambda: client.infer(MODEL, [as_int32])),
            "streaming on ModelInfer": _status_of(
                lambda: client.infer(MODEL, _prompt("hi", streaming=True))
            ),
            "max_tokens 0": _status_of(
                lambda: client.infer(MODEL, _prompt("hi"), parameters={"max_tokens": 0})
            ),
            "echo INPUT0 as FP32": _status_of(
                lambda: client.infer(
                    TENSOR_MODEL, [_tensor("INPUT0", "FP32", np.array([1], dtype=np.float32))]
                )
            ),
        }
    want = {
        "unknown model": "StatusCode.NOT_FOUND",
        "unknown model metadata": "StatusCode.NOT_FOUND",
        "missing text_input": "StatusCode.INVALID_ARGUMENT",
        "text_input as INT32": "StatusCode.INVALID_ARGUMENT",
        "streaming on ModelInfer": "StatusCode.INVALID_ARGUMENT",
        "max_tokens 0": "StatusCode.INVALID_ARGUMENT",
        "echo INPUT0 as FP32": "StatusCode.INVALID_ARGUMENT",
    }
    assert got == want, {k: (got[k], want[k]) for k in want if got[k] != want[k]}


# --- cancellation ------------------------------------------------------------------------------


@client_check
def _stream_a_long_request_then_cancel(target: Target) -> None:
    """Start a 3000-token request on a stream, read three deltas, then cancel the stream."""
    deltas = threading.Event()
    seen: list[str] = []

    def on_response(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        if result is not None and _text_of(result, "text_output"):
            seen.append(result.get_response().id)
            if len(seen) >= 3:
                deltas.set()

    with _client(target) as client:
        client.start_stream(callback=on_response)
        client.async_stream_infer(
            MODEL,
            _prompt("Tell me a long story.", streaming=True),
            request_id="long",
            parameters={"max_tokens": 3000, "ignore_eos": True},
        )
        is_streaming = deltas.wait(WAIT_S)
        client.stop_stream(cancel_requests=True)
    assert is_streaming, f"only {len(seen)} deltas before the wait ended"


def test_a_cancelled_stream_request_is_cancelled_at_the_worker(
    triton: ClientProcess, grpc_slow_stack: Stack
) -> None:
    triton.run(_stream_a_long_request_then_cancel, grpc_slow_stack)
    run_dir = grpc_slow_stack.run_dir
    finished = _wait_for_log_event(
        run_dir / "gateway.log",
        lambda e: e.get("event") == "request_finished" and e.get("rpc") == "ModelStreamInfer",
    )
    assert finished["status"] == "CANCELLED", finished
    cancelled = _wait_for_log_event(
        run_dir / "mocker-0.log",
        lambda e: (
            e.get("event") == "request_cancelled" and e.get("request_id") == finished["request_id"]
        ),
    )
    assert cancelled["reason"] == "client_disconnected", cancelled


DEADLINE_REQUEST_ID = "e2e-grpc-deadline"


@client_check
def _infer_a_long_request_past_its_deadline(target: Target) -> None:
    """A 3000-token ``ModelInfer`` with a 0.5 s deadline and our ``x-request-id``."""
    with _client(target) as client:
        status = _status_of(
            lambda: client.infer(
                MODEL,
                _prompt("Tell me a long story."),
                parameters={"max_tokens": 3000, "ignore_eos": True},
                headers={"x-request-id": DEADLINE_REQUEST_ID},
                client_timeout=0.5,
            )
        )
    assert status == "StatusCode.DEADLINE_EXCEEDED", status


def test_a_model_infer_past_its_deadline_is_cancelled_at_the_worker(
    triton: ClientProcess, grpc_slow_stack: Stack
) -> None:
    triton.run(_infer_a_long_request_past_its_deadline, grpc_slow_stack)
    cancelled = _wait_for_log_event(
        grpc_slow_stack.run_dir / "mocker-0.log",
        lambda e: (
            e.get("event") == "request_cancelled" and e.get("request_id") == DEADLINE_REQUEST_ID
        ),
    )
    assert cancelled["reason"] == "timeout", cancelled


def _wait_for_log_event(path: Path, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first JSON log line of ``path`` that ``match`` accepts (polled up to ``WAIT_S``)."""

    def first_match() -> dict[str, Any] | None:
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and match(event):
                return event
        return None

    return eventually(
        first_match,
        timeout_s=WAIT_S,
        interval_s=0.1,
        message=lambda: f"no such event in {path.name}:\n{path.read_text()[-3000:]}",
    )


# --- grpc.health.v1 and server reflection (no inference.* types needed: in this process) ---------


def test_health_check_says_serving_for_the_server_and_the_inference_service(
    grpc_stack: Stack,
) -> None:
    with grpc.insecure_channel(grpc_stack.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        statuses = [
            health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            for name in ("", SERVICE)
        ]
    assert statuses == [health_pb2.HealthCheckResponse.SERVING] * 2


def test_reflection_lists_the_services_and_describes_the_inference_rpcs(
    grpc_stack: Stack,
) -> None:
    """What ``grpcurl list`` and ``grpcurl describe inference.GRPCInferenceService`` show."""
    with grpc.insecure_channel(grpc_stack.grpc_address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        # A private pool: the default one may hold shared.kserve's copy of these names.
        pool = descriptor_pool.DescriptorPool(database)
        methods = {m.name for m in pool.FindServiceByName(SERVICE).methods}
    assert services == {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    assert methods == RPCS


# --- API keys (issue 12) ------------------------------------------------------------------------

GRPC_KEY = "grpc-key"


@pytest.fixture(scope="module")
def keyed_grpc_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """A stack whose gateway wants ``GRPC_KEY`` (``--api-key``)."""
    gateway = ["--api-key", GRPC_KEY]
    with running_stack(
        tmp_path_factory.mktemp("keyed-grpc"),
        model_dir,
        workers=1,
        service_args={"gateway": gateway},
    ) as stack:
        yield stack


@client_check
def refused_without_the_key(target: Target) -> None:
    with _client(target) as client:
        assert client.is_server_live()  # KServe's probes stay open, like /health
        assert client.is_server_ready()
        statuses = {
            _status_of(lambda: client.infer(MODEL, _prompt("Hi"))),
            _status_of(lambda: client.infer(MODEL, _prompt("Hi"), headers={"authorization": "x"})),
            _status_of(
                lambda: client.infer(
                    MODEL, _prompt("Hi"), headers={"authorization": "Bearer wrong"}
                )
            ),
            _status_of(lambda: client.get_model_metadata(MODEL)),
        }
    assert statuses == {"StatusCode.UNAUTHENTICATED"}, statuses


@client_check
def served_with_the_key(target: Target) -> None:
    headers = {"authorization": f"Bearer {GRPC_KEY}"}
    with _client(target) as client:
        result = client.infer(MODEL, _prompt("Hi"), headers=headers)
        assert _text_of(result, "text_output")
        assert client.get_model_metadata(MODEL, headers=headers).name == MODEL


def test_grpc_refuses_a_call_without_the_key(
    triton: ClientProcess, keyed_grpc_stack: Stack
) -> None:
    triton.run(refused_without_the_key, keyed_grpc_stack)


def test_grpc_serves_a_call_with_the_key(triton: ClientProcess, keyed_grpc_stack: Stack) -> None:
    triton.run(served_with_the_key, keyed_grpc_stack)


if __name__ == "__main__":
    _serve_checks(sys.stdin)
