"""Property-based fuzzing of ``/v1/chat/completions`` and ``/v1/completions`` against the whole
stack (every service a process, real NATS, mocker workers).

``hypothesis`` builds request bodies around a valid core: every OpenAI / vLLM / ``nvext`` field
with plausible, extreme and ill-typed values, unknown fields, arbitrary JSON in known fields,
bodies that are not objects and bytes that are not JSON. For every case: no 5xx, an answer
within the client timeout (no hang), a 4xx body that is JSON with the OpenAI ``error`` object, a
200 that is a complete JSON body or an SSE stream ending in ``[DONE]`` with no internal error in
it. Derandomized, so a run is reproducible; the number of cases is printed (``-s``).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL

CHAT_EXAMPLES = 400
COMPLETION_EXAMPLES = 200
CLIENT_TIMEOUT_S = 30.0

_SETTINGS = settings(
    max_examples=CHAT_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --- values --------------------------------------------------------------------------------------

ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
TEXT = st.text(max_size=40)
NAME = st.from_regex(r"[a-zA-Z0-9_-]{1,12}", fullmatch=True)


def _mixed(*good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Plausible values (in and out of range); anything-at-all comes from ``bodies``."""
    return st.one_of(*good)


SCHEMA = st.sampled_from(
    [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"s": {"type": "string", "enum": ["x", "y"]}}},
        {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        {"type": "string", "maxLength": 5},
        {},
        {"type": "object", "properties": {"n": {"$ref": "#/nope"}}},
    ]
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "function", "custom"]),
        "function": st.fixed_dictionaries(
            {"name": st.one_of(NAME, TEXT)},
            optional={"description": TEXT, "parameters": st.one_of(SCHEMA, ANY_JSON)},
        ),
    }
)
TOOL_CHOICE = st.one_of(
    st.sampled_from(["none", "auto", "required", "sometimes"]),
    st.builds(lambda n: {"type": "function", "function": {"name": n}}, NAME),
)
RESPONSE_FORMAT = st.one_of(
    st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "yaml"}]),
    st.builds(
        lambda name, schema, strict: {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": strict},
        },
        st.one_of(NAME, TEXT),
        SCHEMA,
        st.booleans(),
    ),
)
NVEXT = st.fixed_dictionaries(
    {},
    optional={
        "annotations": _mixed(
            st.lists(st.sampled_from(["request_id", "formatted_prompt", "token_ids", "x"]))
        ),
        "token_data": _mixed(st.lists(st.integers(0, 1000), min_size=1, max_size=8)),
        "use_raw_prompt": _mixed(st.booleans()),
        "greed_sampling": _mixed(st.booleans()),
        "max_thinking_tokens": _mixed(st.integers(0, 8), st.just(2**32)),
        "allowed_worker_ids": _mixed(st.lists(NAME, max_size=3)),
        "backend_instance_id": _mixed(NAME, st.integers(0, 9)),
        "cache_salt": _mixed(TEXT),
        "extra_fields": _mixed(st.lists(st.sampled_from(["worker_id", "timing", "other"]))),
        "overlap_score_weight": _mixed(st.floats(-1, 5)),
        "router_temperature": _mixed(st.floats(-1, 5)),
        "agent_hints": ANY_JSON,
    },
)
COMMON: dict[str, st.SearchStrategy[Any]] = {
    "stream": _mixed(st.booleans()),
    "stream_options": _mixed(
        st.fixed_dictionaries(
            {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
        )
    ),
    "n": _mixed(st.integers(1, 3), st.sampled_from([0, -1, 128, 129])),
    "temperature": _mixed(st.floats(0, 2), st.sampled_from([-0.1, 2.1, 1e308])),
    "top_p": _mixed(st.floats(0, 1), st.sampled_from([0, 1.5])),
    "top_k": _mixed(st.integers(-2, 50)),
    "min_p": _mixed(st.floats(0, 1), st.just(1.5)),
    "presence_penalty": _mixed(st.floats(-2, 2), st.just(2.5)),
    "frequency_penalty": _mixed(st.floats(-2, 2), st.just(-3)),
    "repetition_penalty": _mixed(st.floats(0.5, 2), st.sampled_from([0, -1])),
    "logit_bias": _mixed(
        st.dictionaries(
            st.one_of(st.integers(0, 150000).map(str), TEXT),
            st.floats(-150, 150),
            max_size=4,
        )
    ),
    "seed": _mixed(st.integers(-(2**64), 2**64)),
    "stop": _mixed(TEXT, st.lists(TEXT, max_size=6)),
    "stop_token_ids": _mixed(st.lists(st.integers(-1, 200000), max_size=3)),
    "ignore_eos": _mixed(st.booleans()),
    "min_tokens": _mixed(st.integers(0, 10)),
    "include_stop_str_in_output": _mixed(st.booleans()),
    "skip_special_tokens": _mixed(st.booleans()),
    "cache_salt": _mixed(TEXT),
    "nvext": _mixed(NVEXT),
    "user": _mixed(TEXT),
    "metadata": _mixed(st.dictionaries(NAME, TEXT, max_size=2)),
    "store": _mixed(st.booleans()),
    "service_tier": _mixed(st.sampled_from(["auto", "default", "flex"])),
}
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user"]), "content": TEXT}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(st.none(), TEXT),
            "tool_calls": st.lists(
                st.builds(
                    lambda i, n, a: {
                        "id": i,
                        "type": "function",
                        "function": {"name": n, "arguments": a},
                    },
                    NAME,
                    NAME,
                    st.sampled_from(['{"city": "Paris"}', "{}", "not json"]),
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "content": TEXT, "tool_call_id": NAME}),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.one_of(
                    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": ANY_JSON}),
                ),
                max_size=3,
            ),
        }
    ),
    st.fixed_dictionaries({"role": st.just("user"), "content": TEXT}),
)
CHAT_ONLY: dict[str, st.SearchStrategy[Any]] = {
    "tools": _mixed(st.lists(TOOL, max_size=3)),
    "tool_choice": _mixed(TOOL_CHOICE),
    "parallel_tool_calls": _mixed(st.booleans()),
    "response_format": _mixed(RESPONSE_FORMAT),
    "logprobs": _mixed(st.booleans()),
    "top_logprobs": _mixed(st.integers(0, 20), st.sampled_from([-1, 21])),
    "max_completion_tokens": _mixed(st.integers(1, 8), st.sampled_from([0, -5])),
    "chat_template_kwargs": _mixed(st.fixed_dictionaries({"enable_thinking": st.booleans()})),
    "add_generation_prompt": _mixed(st.booleans()),
    "continue_final_message": _mixed(st.booleans()),
    "modalities": _mixed(st.lists(st.sampled_from(["text", "audio"]), max_size=2)),
    "reasoning_effort": _mixed(st.sampled_from(["low", "medium", "high"])),
}
COMPLETION_ONLY: dict[str, st.SearchStrategy[Any]] = {
    "echo": _mixed(st.booleans()),
    "logprobs": _mixed(st.integers(0, 5), st.sampled_from([6, -1])),
    "best_of": _mixed(st.integers(1, 3)),
    "suffix": _mixed(st.sampled_from(["", "end"])),
}
SMALL_MAX_TOKENS = st.integers(1, 8)
BAD_MAX_TOKENS = st.sampled_from([0, -1, 2**63, "8", 1.5, [8]])
UNKNOWN_KEYS = st.sampled_from(["frobnicate", "best_of_n", "use_beam_search", "guided_json", ""])


FRESH_ID = "<fresh>"
"""Replaced by a new valid id per case: the stack treats a reused id as the same request."""
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "x-request-id": st.sampled_from([FRESH_ID, FRESH_ID, "a.b", "x" * 80, "sp ace"]),
        "x-tenant-id": st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        "x-worker-instance-id": st.sampled_from(["no-such-worker", "a.b"]),
        "x-prefill-instance-id": st.just("7"),
        "x-dp-rank": st.just("0"),
    },
)
"""Routing and id headers, Dynamo's among them."""


def _sometimes(draw: st.DrawFn, n: int) -> bool:
    """True but one time in ``n`` (hypothesis favours small integers, so not ``== 0``)."""
    return draw(st.integers(0, n - 1)) != n - 1


@st.composite
def bodies(draw: st.DrawFn, api: str) -> bytes:
    """One request body: a valid core, a random subset of fields, sometimes broken."""
    shape = "body" if _sometimes(draw, 8) else draw(st.sampled_from(["not-object", "not-json"]))
    if shape == "not-json":
        return draw(
            st.sampled_from([b"", b"{", b'{"model": ', b"\xff\xfe", b"nul"])
            | st.binary(max_size=30)
        )
    if shape == "not-object":
        return msgspec.json.encode(draw(ANY_JSON.filter(lambda v: not isinstance(v, dict))))
    # A valid request always has a small token budget: one without could run to the context.
    body: dict[str, Any] = {
        "model": MODEL if _sometimes(draw, 6) else draw(st.sampled_from(["no-such-model", ""])),
        "max_tokens": draw(SMALL_MAX_TOKENS if _sometimes(draw, 8) else BAD_MAX_TOKENS),
    }
    if api == "chat":
        valid = st.lists(MESSAGE, max_size=3).map(
            lambda ms: [*ms, {"role": "user", "content": "hi"}]
        )
        invalid = st.one_of(
            st.lists(MESSAGE, max_size=3).map(lambda ms: [*ms, {"role": "user"}]),
            st.just([]),
            st.lists(ANY_JSON, min_size=1, max_size=2),
        )
        body["messages"] = draw(valid if _sometimes(draw, 8) else invalid)
        fields = {**COMMON, **CHAT_ONLY}
    else:
        valid = TEXT.filter(bool) | st.lists(st.integers(0, 151000), min_size=1, max_size=8)
        invalid = st.lists(TEXT, min_size=1, max_size=2) | st.lists(
            st.integers(-5, 2**40), min_size=1, max_size=3
        )
        body["prompt"] = draw(valid if _sometimes(draw, 8) else invalid)
        fields = {**COMMON, **COMPLETION_ONLY}
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=6, unique=True))
    for name in chosen:
        body[name] = draw(fields[name])
    if not _sometimes(draw, 10):
        body[draw(UNKNOWN_KEYS)] = draw(ANY_JSON)
    if not _sometimes(draw, 6):  # a known field holding anything at all
        body[draw(st.sampled_from(sorted(fields)))] = draw(ANY_JSON)
    if body.get("max_completion_tokens") is None and "max_completion_tokens" in body:
        del body["max_completion_tokens"]
    return msgspec.json.encode(body)


def check(response: httpx.Response, body: bytes) -> str:
    """The response's class (``2xx`` / ``4xx``), asserting the protocol's rules."""
    status = response.status_code
    assert status < 500, f"{status} for {body[:600]!r}: {response.text[:600]}"
    if status >= 400:
        error = response.json().get("error")
        assert isinstance(error, dict), response.text
        assert isinstance(error.get("message"), str)
        assert isinstance(error.get("type"), str)
        return "4xx"
    assert status == 200, status
    text = response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        assert text.endswith("data: [DONE]\n\n"), text[-300:]
        assert "internal_error" not in text, text[-600:]
    else:
        assert "choices" in response.json()
    return "2xx"


def _fuzz(stack: Stack, path: str, api: str, examples: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    slow: list[tuple[float, int, dict[str, str], bytes]] = []
    with httpx.Client(base_url=stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:

        @settings(_SETTINGS, max_examples=examples)
        @given(body=bodies(api), headers=HEADERS)
        def one(body: bytes, headers: dict[str, str]) -> None:
            if headers.get("x-request-id") == FRESH_ID:
                headers = {**headers, "x-request-id": f"fz-{uuid.uuid4().hex}"}
            sent = {"content-type": "application/json", **headers}
            started = time.monotonic()
            response = http.post(path, content=body, headers=sent)
            took = time.monotonic() - started
            if took > 1.0:
                slow.append((took, response.status_code, headers, body[:300]))
            seen[check(response, body)] += 1
            echoed = response.headers.get("x-request-id", "")
            assert echoed, "every answer carries x-request-id"
            asked = headers.get("x-request-id", "")
            if asked and len(asked) <= 64 and asked.replace("-", "").replace("_", "").isalnum():
                assert echoed == asked
            elif asked:
                assert echoed != asked  # not a usable id: the gateway made its own

        one()
    for case in sorted(slow, key=lambda c: c[0], reverse=True)[:8]:
        print(f"slow: {case}")
    return seen


@pytest.mark.timeout(240)
def test_chat_fuzz(stack: Stack) -> None:
    seen = _fuzz(stack, "/v1/chat/completions", "chat", CHAT_EXAMPLES)
    print(f"\nfuzz /v1/chat/completions: {sum(seen.values())} cases {dict(seen)}")
    # Both paths were exercised: requests that generated and requests that were refused.
    assert seen["2xx"] >= 10
    assert seen["4xx"] >= 10


@pytest.mark.timeout(240)
def test_completion_fuzz(stack: Stack) -> None:
    seen = _fuzz(stack, "/v1/completions", "completion", COMPLETION_EXAMPLES)
    print(f"\nfuzz /v1/completions: {sum(seen.values())} cases {dict(seen)}")
    assert seen["2xx"] >= 10
    assert seen["4xx"] >= 10
