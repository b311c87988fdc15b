"""The pure core: token ids, context-length checks, max_tokens and stop-id resolution."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from services.preprocessor.prepare import (
    generate,
    prepare,
    prompt_chars,
    rendered_chat,
    resolve_max_tokens,
    resolve_stop_token_ids,
    stream_open,
)
from services.preprocessor.tokenizer import ModelAssets
from shared.errors import ContextLengthExceeded, InvalidRequest
from shared.hashing import prefix_hashes
from shared.messages import OutputOptions, Preprocess, RoutingHints, SamplingParams

from .conftest import QWEN, QWEN_EOS

CHAT_TEXT = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
CHAT = (
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is the capital of France?"},
)


def request(**fields: Any) -> Preprocess:
    base: dict[str, Any] = {
        "request_id": "r1",
        "api": "chat",
        "model": QWEN,
        "reply_to": "gw.r1",
        "created": 1,
        "messages": CHAT,
    }
    return Preprocess(**{**base, **fields})


def small(assets: ModelAssets, context_length: int) -> ModelAssets:
    return ModelAssets(
        model=assets.model,
        tokenizer=assets.tokenizer,
        context_length=context_length,
        eos_token_ids=assets.eos_token_ids,
        vocab_size=assets.vocab_size,
        chat_templates=assets.chat_templates,
        special_tokens=assets.special_tokens,
    )


class TestResolveMaxTokens:
    def test_requested_value_is_kept(self) -> None:
        assert resolve_max_tokens(100, prompt_tokens=10, context_length=4096) == 100

    def test_default_is_the_rest_of_the_context(self) -> None:
        assert resolve_max_tokens(None, prompt_tokens=10, context_length=4096) == 4086

    def test_exact_fit_is_allowed(self) -> None:
        assert resolve_max_tokens(4086, prompt_tokens=10, context_length=4096) == 4086

    def test_one_over_is_context_length_exceeded(self) -> None:
        with pytest.raises(ContextLengthExceeded, match="maximum context length is 4096") as info:
            resolve_max_tokens(4087, prompt_tokens=10, context_length=4096)
        assert (info.value.limit, info.value.requested) == (4096, 4097)

    def test_prompt_filling_the_context_leaves_no_room(self) -> None:
        with pytest.raises(ContextLengthExceeded) as info:
            resolve_max_tokens(None, prompt_tokens=4096, context_length=4096)
        assert info.value.status == 400

    def test_zero_max_tokens_is_rejected(self) -> None:
        with pytest.raises(InvalidRequest, match="at least 1"):
            resolve_max_tokens(0, prompt_tokens=10, context_length=4096)


class TestResolveStopTokenIds:
    def test_eos_ids_are_appended(self) -> None:
        assert resolve_stop_token_ids([7], [2, 3], ignore_eos=False) == (7, 2, 3)

    def test_ignore_eos_keeps_only_the_clients(self) -> None:
        assert resolve_stop_token_ids([7], [2, 3], ignore_eos=True) == (7,)

    def test_duplicates_are_dropped(self) -> None:
        assert resolve_stop_token_ids([3, 7], [2, 3], ignore_eos=False) == (3, 7, 2)


class TestPrepareChat:
    def test_token_ids_are_the_templated_prompt(self, qwen_assets: ModelAssets) -> None:
        expected = qwen_assets.tokenizer.encode(CHAT_TEXT, add_special_tokens=False).ids
        assert list(prepare(request(), qwen_assets).token_ids) == expected

    def test_special_tokens_are_single_ids(self, qwen_assets: ModelAssets) -> None:
        ids = prepare(request(), qwen_assets).token_ids
        assert ids[0] == 151644  # <|im_start|>

    def test_sampling_is_resolved(self, qwen_assets: ModelAssets) -> None:
        req = request(max_tokens=50, sampling=SamplingParams(temperature=0.2, stop_token_ids=(9,)))
        sampling = prepare(req, qwen_assets).sampling
        assert sampling == SamplingParams(
            max_tokens=50, temperature=0.2, stop_token_ids=(9, *QWEN_EOS)
        )

    def test_no_max_tokens_fills_the_context(self, qwen_assets: ModelAssets) -> None:
        prepared = prepare(request(), qwen_assets)
        assert prepared.sampling.max_tokens == 40960 - prepared.prompt_tokens

    def test_long_prompt_is_context_length_exceeded(self, qwen_assets: ModelAssets) -> None:
        with pytest.raises(ContextLengthExceeded, match="maximum context length is 20 tokens"):
            prepare(request(max_tokens=5), small(qwen_assets, 20))

    def test_empty_messages_are_rejected(self, qwen_assets: ModelAssets) -> None:
        with pytest.raises(InvalidRequest, match="messages must not be empty"):
            prepare(request(messages=()), qwen_assets)

    def test_min_tokens_above_max_tokens_is_rejected(self, qwen_assets: ModelAssets) -> None:
        req = request(max_tokens=4, sampling=SamplingParams(min_tokens=5))
        with pytest.raises(InvalidRequest, match="min_tokens"):
            prepare(req, qwen_assets)

    def test_echo_returns_the_last_assistant_message(self, qwen_assets: ModelAssets) -> None:
        messages = (*CHAT, {"role": "assistant", "content": "Paris"})
        req = request(
            messages=messages,
            add_generation_prompt=False,
            continue_final_message=True,
            output=OutputOptions(echo=True),
        )
        assert prepare(req, qwen_assets).prompt_text == "Paris"

    def test_echo_of_a_user_turn_is_empty(self, qwen_assets: ModelAssets) -> None:
        req = request(output=OutputOptions(echo=True))
        assert prepare(req, qwen_assets).prompt_text == ""


class TestPrepareCompletion:
    def test_prompt_is_tokenized(self, qwen_assets: ModelAssets) -> None:
        req = request(api="completion", messages=(), prompt="Hello world")
        expected = qwen_assets.tokenizer.encode("Hello world").ids
        assert list(prepare(req, qwen_assets).token_ids) == expected

    def test_prompt_token_ids_skip_tokenization(self, qwen_assets: ModelAssets) -> None:
        req = request(api="completion", messages=(), prompt_token_ids=(9707, 1879))
        assert prepare(req, qwen_assets).token_ids == (9707, 1879)

    def test_out_of_vocab_id_is_rejected(self, qwen_assets: ModelAssets) -> None:
        req = request(api="completion", messages=(), prompt_token_ids=(1, 151936))
        with pytest.raises(InvalidRequest, match="151936 is out of vocabulary"):
            prepare(req, qwen_assets)

    def test_empty_prompt_is_rejected(self, qwen_assets: ModelAssets) -> None:
        req = request(api="completion", messages=(), prompt="")
        with pytest.raises(InvalidRequest, match="cannot be empty"):
            prepare(req, qwen_assets)

    def test_missing_prompt_is_rejected(self, qwen_assets: ModelAssets) -> None:
        with pytest.raises(InvalidRequest, match="needs a prompt"):
            prepare(request(api="completion", messages=()), qwen_assets)

    def test_echo_passes_the_prompt_text(self, qwen_assets: ModelAssets) -> None:
        req = request(
            api="completion", messages=(), prompt="Hello", output=OutputOptions(echo=True)
        )
        assert prepare(req, qwen_assets).prompt_text == "Hello"

    def test_echo_of_token_ids_decodes_them(self, qwen_assets: ModelAssets) -> None:
        req = request(
            api="completion",
            messages=(),
            prompt_token_ids=(9707, 1879),
            output=OutputOptions(echo=True),
        )
        assert prepare(req, qwen_assets).prompt_text == "Hello world"


class TestMessages:
    def test_stream_open_carries_counts_and_options(self, qwen_assets: ModelAssets) -> None:
        req = request(max_tokens=7, output=OutputOptions(stream=True))
        prepared = prepare(req, qwen_assets)
        opened = stream_open(req, prepared)
        assert (opened.prompt_tokens, opened.max_tokens, opened.output.stream) == (
            prepared.prompt_tokens,
            7,
            True,
        )

    def test_generate_carries_ids_sampling_and_stream(self, qwen_assets: ModelAssets) -> None:
        req = request(max_tokens=7)
        prepared = prepare(req, qwen_assets)
        message = generate(req, prepared, "fmt.r1")
        assert msgspec.structs.asdict(message) == {
            "request_id": "r1",
            "model": QWEN,
            "token_ids": prepared.token_ids,
            "sampling": prepared.sampling,
            "stream_to": "fmt.r1",
            "worker_id": None,
            "routing": None,
            "resumed_tokens": 0,
            "reply_to": req.reply_to,
            "attempt": 0,
            "block_hashes": (),
            "hash_block_size": 0,
            "dp_rank": 0,
            "prefill_to": "",
            "kv_transfer": None,
            "images": (),
        }

    def test_stream_open_carries_the_generate_when_migration_is_on(
        self, qwen_assets: ModelAssets
    ) -> None:
        req = request(max_tokens=7)
        prepared = prepare(req, qwen_assets)
        opened = stream_open(req, prepared, migration_limit=2, max_seq_len=99)
        assert opened.generate == generate(req, prepared, "")
        assert (opened.migration_limit, opened.migration_max_seq_len) == (2, 99)

    def test_stream_open_has_no_generate_without_migration_or_when_pinned(
        self, qwen_assets: ModelAssets
    ) -> None:
        req = request(max_tokens=7)
        prepared = prepare(req, qwen_assets)
        assert stream_open(req, prepared).generate is None
        pinned = msgspec.structs.replace(req, worker_id="w-1")
        opened = stream_open(pinned, prepared, migration_limit=3)
        assert (opened.generate, opened.migration_limit) == (None, 0)

    def test_generate_carries_pinned_worker_and_routing_hints(
        self, qwen_assets: ModelAssets
    ) -> None:
        hints = RoutingHints(cache_salt="tenant-a", router_temperature=0.5)
        req = msgspec.structs.replace(request(max_tokens=7), worker_id="w-1", routing=hints)
        message = generate(req, prepare(req, qwen_assets), "fmt.r1")
        assert (message.worker_id, message.routing) == ("w-1", hints)

    def test_with_the_model_s_block_size_the_prompt_is_hashed_once_for_the_router(
        self, qwen_assets: ModelAssets
    ) -> None:
        hashed = dataclasses.replace(qwen_assets, kv_block_size=4)
        hints = RoutingHints(cache_salt="tenant-a")
        req = msgspec.structs.replace(request(max_tokens=7), routing=hints)
        message = generate(req, prepare(req, hashed), "fmt.r1")
        assert len(message.token_ids) >= 8
        assert message.hash_block_size == 4
        assert list(message.block_hashes) == prefix_hashes(
            message.token_ids, 4, cache_salt="tenant-a"
        )

    def test_prompt_chars_counts_text_parts(self) -> None:
        content = [{"type": "text", "text": "abc"}, {"type": "text", "text": "de"}]
        assert prompt_chars(request(messages=({"role": "user", "content": content},))) == 5


def test_a_pre_rendered_chat_prompt_gives_the_same_result(qwen_assets: ModelAssets) -> None:
    req = request()
    rendered = rendered_chat(req, qwen_assets)
    assert prepare(req, qwen_assets, rendered) == prepare(req, qwen_assets)


def test_nvext_token_data_on_chat_skips_the_template(qwen_assets: ModelAssets) -> None:
    ids = tuple(qwen_assets.encode("Hello there", add_special_tokens=False))
    req = request(api="chat", messages=({"role": "user", "content": "ignored"},))
    prepared = prepare(msgspec.structs.replace(req, prompt_token_ids=ids), qwen_assets)
    assert prepared.token_ids == ids
    with pytest.raises(InvalidRequest, match="out of vocabulary"):
        prepare(msgspec.structs.replace(req, prompt_token_ids=(10**9,)), qwen_assets)


def test_use_raw_prompt_tokenizes_the_messages_as_they_are(qwen_assets: ModelAssets) -> None:
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    templated = prepare(request(api="chat", messages=messages), qwen_assets)
    raw = prepare(request(api="chat", messages=messages, use_raw_prompt=True), qwen_assets)
    assert qwen_assets.decode(raw.token_ids) == "Be brief.\nHi"
    assert len(raw.token_ids) < len(templated.token_ids)


def test_annotations_carry_what_the_client_asked_for(qwen_assets: ModelAssets) -> None:
    messages = ({"role": "user", "content": "Hi"},)
    output = OutputOptions(annotations=("token_ids", "formatted_prompt", "request_id"))
    req = request(api="chat", messages=messages, output=output)
    prepared = prepare(req, qwen_assets)
    names = [name for name, _ in stream_open(req, prepared).annotations]
    assert names == ["token_ids", "formatted_prompt", "request_id"]
    notes = dict(stream_open(req, prepared).annotations)
    assert msgspec.json.decode(notes["token_ids"]) == list(prepared.token_ids)
    assert msgspec.json.decode(notes["formatted_prompt"]).endswith("<|im_start|>assistant\n")
    assert msgspec.json.decode(notes["request_id"]) == req.request_id
    assert stream_open(request(api="chat", messages=messages), prepared).annotations == ()
