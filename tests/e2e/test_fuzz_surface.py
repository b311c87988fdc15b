"""Property-based fuzzing of the rest of the API surface against the whole stack: Anthropic
``/v1/messages`` and ``/v1/messages/count_tokens``, ``/v1/responses``, ``/v1/embeddings`` and
``/v1/images/generations`` (``test_fuzz_api.py`` does chat and completions).

Each body starts from a valid request; a random subset of the endpoint's documented fields (the
request Struct's, as ``/openapi.json`` lists them) gets a plausible, extreme or ill-typed value
or any JSON at all; sometimes a required field goes, an unknown field comes, or the body is not
an object or not JSON. For every case: no 5xx, an answer within the client timeout, an error
body in the API's own dialect (Anthropic's ``{"type": "error", "error": {...}}`` on its routes,
OpenAI's elsewhere), and a stream that ends with the API's terminal event. Derandomized; the
number of cases per endpoint is printed (``-s``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.cli.stack import Stack
from services.embedder.model import DEFAULT_EMBEDDING_MODEL
from services.gateway.http.openapi import ENDPOINTS
from tests.e2e.conftest import MODEL, serving_models
from tests.e2e.test_fuzz_api import _SETTINGS, ANY_JSON, CLIENT_TIMEOUT_S, NAME, SCHEMA, TEXT

SMALL = st.integers(1, 6)
BAD_INT = st.sampled_from([0, -1, 2**63, "8", 1.5, [8], None])
FLOAT_01 = st.floats(0, 1) | st.sampled_from([-0.1, 1.5, 1e308])
ANTHROPIC_TOOL = st.fixed_dictionaries(
    {"name": st.one_of(NAME, TEXT), "input_schema": st.one_of(SCHEMA, ANY_JSON)},
    optional={"description": TEXT, "type": st.sampled_from(["custom", "bash_20250124"])},
)
ANTHROPIC_CONTENT = st.one_of(
    TEXT,
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
            st.fixed_dictionaries(
                {"type": st.just("tool_use"), "id": NAME, "name": NAME, "input": ANY_JSON}
            ),
            st.fixed_dictionaries(
                {"type": st.just("tool_result"), "tool_use_id": NAME, "content": TEXT}
            ),
            st.fixed_dictionaries(
                {"type": st.just("thinking"), "thinking": TEXT, "signature": TEXT}
            ),
            st.fixed_dictionaries({"type": st.just("image"), "source": ANY_JSON}),
        ),
        max_size=3,
    ),
)
ANTHROPIC_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system"]), "content": ANTHROPIC_CONTENT}
    ),
    max_size=3,
).map(lambda ms: [*ms, {"role": "user", "content": "hi"}])
ANTHROPIC_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "system": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})),
    "messages": ANTHROPIC_MESSAGES | st.just([]),
    "max_tokens": SMALL | BAD_INT,
    "stream": st.booleans(),
    "stop_sequences": st.lists(TEXT, max_size=3),
    "temperature": FLOAT_01,
    "top_p": FLOAT_01,
    "top_k": st.integers(-2, 50),
    "tools": st.lists(ANTHROPIC_TOOL, max_size=2),
    "tool_choice": st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "none", "maybe"])}),
        st.fixed_dictionaries({"type": st.just("tool"), "name": NAME}),
    ),
    "thinking": st.one_of(
        st.fixed_dictionaries({"type": st.just("enabled"), "budget_tokens": st.integers(-1, 2048)}),
        st.fixed_dictionaries({"type": st.sampled_from(["disabled", "adaptive", "on"])}),
    ),
    "metadata": st.fixed_dictionaries({}, optional={"user_id": TEXT}),
}
RESPONSES_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "input": TEXT
    | st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "system", "x"]), "content": TEXT}
            ),
            st.fixed_dictionaries(
                {"type": st.just("function_call_output"), "call_id": NAME, "output": TEXT}
            ),
            ANY_JSON,
        ),
        max_size=3,
    ),
    "instructions": TEXT,
    "stream": st.booleans(),
    "max_output_tokens": st.integers(16, 20) | BAD_INT,
    "temperature": st.floats(0, 2) | st.just(-1),
    "top_p": FLOAT_01,
    "top_logprobs": st.integers(-1, 21),
    "tools": st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["function", "web_search"]), "name": NAME},
            optional={"parameters": SCHEMA, "strict": st.booleans()},
        ),
        max_size=2,
    ),
    "tool_choice": st.sampled_from(["none", "auto", "required", "x"])
    | st.fixed_dictionaries({"type": st.just("function"), "name": NAME}),
    "reasoning": st.fixed_dictionaries(
        {}, optional={"effort": st.sampled_from(["low", "high", "x"]), "summary": TEXT}
    ),
    "text": st.fixed_dictionaries(
        {},
        optional={
            "format": st.one_of(
                st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "xml"])}),
                st.fixed_dictionaries(
                    {"type": st.just("json_schema"), "name": NAME, "schema": SCHEMA}
                ),
            )
        },
    ),
    "include": st.lists(st.sampled_from(["message.output_text.logprobs", "x"]), max_size=2),
    "previous_response_id": NAME,
    "background": st.booleans(),
    "store": st.booleans(),
}
EMBEDDING_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "input": TEXT
    | st.lists(TEXT, max_size=4)
    | st.lists(st.integers(-5, 200000), max_size=6)
    | st.lists(st.lists(st.integers(0, 1000), max_size=4), max_size=3),
    "encoding_format": st.sampled_from(["float", "base64", "int8"]),
    "dimensions": st.integers(-1, 2048),
    "user": TEXT,
}
IMAGE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "prompt": TEXT,
    "n": st.integers(-1, 12),
    "size": st.sampled_from(["256x256", "1024x1024", "auto", "7x7", "big"]),
    "response_format": st.sampled_from(["url", "b64_json", "gif"]),
    "seed": st.integers(-(2**64), 2**64),
}


class Surface(NamedTuple):
    path: str
    base: dict[str, Any]
    """A valid request."""
    fields: dict[str, st.SearchStrategy[Any]]
    anthropic: bool = False
    examples: int = 100


SURFACES = [
    Surface(
        "/v1/messages",
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        ANTHROPIC_FIELDS,
        anthropic=True,
        examples=200,
    ),
    Surface(
        "/v1/messages/count_tokens",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        {k: v for k, v in ANTHROPIC_FIELDS.items() if k in ("system", "messages", "tools")},
        anthropic=True,
        examples=60,
    ),
    Surface(
        "/v1/responses",
        {"model": MODEL, "input": "hi", "max_output_tokens": 16},
        RESPONSES_FIELDS,
        examples=200,
    ),
    Surface("/v1/embeddings", {"model": DEFAULT_EMBEDDING_MODEL, "input": "hi"}, EMBEDDING_FIELDS),
    Surface("/v1/images/generations", {"model": "no-media-model", "prompt": "p"}, IMAGE_FIELDS),
]


@pytest.fixture(scope="module")
def surface_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """One chat worker and one mock embedder (no media worker: images stop at the model)."""
    run_dir = tmp_path_factory.mktemp("fuzz")
    models = [MODEL, DEFAULT_EMBEDDING_MODEL]
    with serving_models(run_dir, model_dir, models, workers=1, embedders=1) as s:
        yield s


def _documented(path: str) -> list[str]:
    """The request fields ``/openapi.json`` documents for ``path``."""
    endpoint = next(e for e in ENDPOINTS if e.path == path)
    assert endpoint.request is not None
    return sorted(endpoint.request.__struct_encode_fields__)


@st.composite
def bodies(draw: st.DrawFn, surface: Surface) -> bytes:
    """A valid request, then some of its documented fields changed, and sometimes broken."""
    shape = draw(st.sampled_from(["body"] * 10 + ["not-object", "not-json"]))
    if shape == "not-json":
        return draw(st.sampled_from([b"", b"{", b"\xff", b"nul"]) | st.binary(max_size=20))
    if shape == "not-object":
        return msgspec.json.encode(draw(ANY_JSON.filter(lambda v: not isinstance(v, dict))))
    body = dict(surface.base)
    documented = _documented(surface.path)
    for name in draw(st.lists(st.sampled_from(documented), max_size=5, unique=True)):
        plausible = surface.fields.get(name)
        body[name] = draw(plausible if plausible is not None else ANY_JSON)
    if draw(st.integers(0, 7)) == 0:
        body[draw(st.sampled_from(documented))] = draw(ANY_JSON)
    if draw(st.integers(0, 9)) == 0:
        body.pop(draw(st.sampled_from(sorted(surface.base))), None)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.sampled_from(["frobnicate", "guided_json", ""]))] = draw(ANY_JSON)
    if surface.path == "/v1/messages" and draw(st.integers(0, 3)) == 0:
        body["model"] = "no-such-model"
    return msgspec.json.encode(body)


def check(response: httpx.Response, body: bytes, *, anthropic: bool) -> str:
    """The response's class (``2xx`` / ``4xx``), asserting the API's rules."""
    status = response.status_code
    assert status < 500, f"{status} for {body[:600]!r}: {response.text[:600]}"
    if status >= 400:
        answer = response.json()
        error = answer.get("error")
        assert isinstance(error, dict), response.text
        assert isinstance(error.get("message"), str), response.text
        assert isinstance(error.get("type"), str), response.text
        if anthropic:
            assert answer.get("type") == "error", response.text
            assert response.headers.get("request-id"), "Anthropic's request-id header"
        return "4xx"
    assert status == 200, status
    text = response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        assert "internal_error" not in text, text[-600:]
        last = [line for line in text.splitlines() if line.startswith("event:")][-1]
        ends = (
            ("message_stop", "error")
            if anthropic
            else ("response.completed", "response.incomplete", "response.failed")
        )
        assert last.removeprefix("event:").strip() in ends, text[-400:]
    else:
        assert isinstance(response.json(), dict)
    return "2xx"


def _fuzz(http: httpx.Client, surface: Surface) -> Counter[str]:
    seen: Counter[str] = Counter()

    @settings(_SETTINGS, max_examples=surface.examples)
    @given(body=bodies(surface))
    def one(body: bytes) -> None:
        headers = {"content-type": "application/json"}
        response = http.post(surface.path, content=body, headers=headers)
        seen[check(response, body, anthropic=surface.anthropic)] += 1

    one()
    return seen


@pytest.mark.timeout(300)
def test_the_rest_of_the_surface_never_fails_a_client(surface_stack: Stack) -> None:
    totals: dict[str, Counter[str]] = {}
    with httpx.Client(base_url=surface_stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        for surface in SURFACES:
            seen = _fuzz(http, surface)
            totals[surface.path] = seen
            print(f"\nfuzz {surface.path}: {sum(seen.values())} cases {dict(seen)}")
    for path, seen in totals.items():
        assert seen["4xx"] >= 5, f"{path}: the bad inputs were refused"
        if path != "/v1/images/generations":  # no media worker in this stack: never 200
            assert seen["2xx"] >= 5, f"{path}: {dict(seen)}: valid requests were served"
