"""The strict request types accept every parameter of the official OpenAI SDK, and the list of
fields accepted but not acted on names real fields (so the closing note cannot drift)."""

from __future__ import annotations

import msgspec
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from services.gateway.apis.accepted_fields import CONDITIONAL, IGNORED, NVEXT_IGNORED
from services.gateway.apis.openai_types import (
    ChatCompletionRequest,
    CompletionRequest,
    Nvext,
    StrictChatCompletionRequest,
    StrictCompletionRequest,
)


def _fields(kind: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(kind)}


SDK_CHAT = set(chat_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
SDK_COMPLETION = set(completion_params.CompletionCreateParamsBase.__annotations__) | {"stream"}


def test_every_sdk_chat_parameter_is_a_field() -> None:
    assert SDK_CHAT - _fields(StrictChatCompletionRequest) == set()


def test_every_sdk_completion_parameter_is_a_field() -> None:
    assert SDK_COMPLETION - _fields(StrictCompletionRequest) == set()


def test_strict_types_add_nothing_but_strictness() -> None:
    assert _fields(StrictChatCompletionRequest) == _fields(ChatCompletionRequest)
    assert _fields(StrictCompletionRequest) == _fields(CompletionRequest)


@pytest.mark.parametrize("name", sorted({*IGNORED, *CONDITIONAL}))
def test_listed_fields_exist(name: str) -> None:
    assert name in _fields(ChatCompletionRequest) | _fields(CompletionRequest)


def test_every_reason_is_a_sentence() -> None:
    for reason in [*IGNORED.values(), *CONDITIONAL.values(), *NVEXT_IGNORED.values()]:
        assert reason.endswith(".")
        assert len(reason) > 20


def test_ignored_nvext_fields_are_not_read() -> None:
    assert set(NVEXT_IGNORED).isdisjoint(_fields(Nvext))
