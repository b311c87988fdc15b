"""API keys end to end (issue 12): a gateway started with ``--api-key`` refuses ``/v1`` requests
without one of its keys with the protocol's own 401 (OpenAI's ``invalid_api_key``, Anthropic's
``authentication_error``) and serves the ones that carry one, as the ``openai`` and
``anthropic`` clients send them; probes and ``/metrics`` stay open. gRPC: ``test_grpc.py``
(``tritonclient`` runs there)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL, running_stack

KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# the second key\n{KEYS[1]}\n")
    gateway = ["--api-key", KEYS[0], "--api-key-file", str(key_file)]
    with running_stack(
        tmp_path_factory.mktemp("keyed"), model_dir, workers=1, service_args={"gateway": gateway}
    ) as stack:
        yield stack


def _openai(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)


def _chat(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize("key", KEYS)
def test_either_key_serves_chat_and_models(keyed: Stack, key: str) -> None:
    with _openai(keyed, key) as client:
        assert _chat(client)
        assert [m.id for m in client.models.list()] == [MODEL]


def test_a_wrong_key_is_a_401_in_openai_shape(keyed: Stack) -> None:
    with _openai(keyed, "wrong") as client, pytest.raises(openai.AuthenticationError) as caught:
        _chat(client)
    assert caught.value.status_code == 401
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["code"] == "invalid_api_key"
    assert caught.value.response.headers["www-authenticate"] == "Bearer"


def test_listing_and_streaming_need_the_key_too(keyed: Stack) -> None:
    with _openai(keyed, "wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, stream=True)


def test_anthropic_clients_send_x_api_key(keyed: Stack) -> None:
    good = anthropic.Anthropic(base_url=keyed.base_url, api_key=KEYS[1], max_retries=0)
    message = good.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.content
    bad = anthropic.Anthropic(base_url=keyed.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 401
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("path", ["/health", "/live", "/metrics"])
def test_probes_and_metrics_stay_open(keyed: Stack, path: str) -> None:
    with urllib.request.urlopen(f"{keyed.base_url}{path}", timeout=5) as resp:
        assert resp.status == 200


def test_the_key_never_reaches_the_logs(keyed: Stack) -> None:
    with _openai(keyed, KEYS[0]) as client:
        _chat(client)
    with _openai(keyed, "wrong-key-in-a-log?") as client, pytest.raises(openai.APIStatusError):
        _chat(client)
    for child in keyed.children:
        if child.log_path is not None:
            text = child.log_path.read_text()
            for secret in (*KEYS, "wrong-key-in-a-log?"):
                assert secret not in text, f"{secret!r} in {child.name}'s log"


def test_no_key_is_a_401_that_reads_no_body(keyed: Stack) -> None:
    request = urllib.request.Request(
        f"{keyed.base_url}/v1/chat/completions",
        data=b"{not json at all",
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 401  # not a 400 for the body: the key is checked first
    assert json.loads(caught.value.read())["error"]["code"] == "invalid_api_key"
