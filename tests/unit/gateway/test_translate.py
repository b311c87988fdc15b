"""Request validation and the mapping of OpenAI bodies onto ``Preprocess``."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.gateway.apis.openai import (
    chat_to_preprocess,
    completion_from,
    completion_to_preprocess,
    parse_chat,
    parse_completion,
    prompts,
)
from shared.errors import InvalidRequest
from shared.messages import Preprocess

USER = {"role": "user", "content": "hi"}


def chat(**fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "messages": [USER], **fields})
    return chat_to_preprocess(parse_chat(body), request_id="r1", reply_to="gw.r1", created=7)


def completion(**fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "prompt": "hello", **fields})
    request = parse_completion(body)
    return completion_to_preprocess(request, request_id="r1", reply_to="gw.r1", created=7)


def chat_error(body: bytes | dict[str, Any]) -> InvalidRequest:
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
    with pytest.raises(InvalidRequest) as caught:
        parse_chat(raw)
    return caught.value


class TestChatValidation:
    def test_malformed_json_is_invalid_without_param(self) -> None:
        error = chat_error(b'{"model": ')
        assert (error.param, error.message.startswith("The request body is not valid JSON")) == (
            None,
            True,
        )

    def test_body_that_is_not_an_object_is_invalid(self) -> None:
        assert chat_error(b"[1, 2]").param is None

    def test_wrong_type_names_the_field(self) -> None:
        assert chat_error({"model": "m", "messages": [USER], "max_tokens": "x"}).param == (
            "max_tokens"
        )

    def test_missing_model_names_model(self) -> None:
        assert chat_error({"messages": [USER]}).param == "model"

    @pytest.mark.parametrize("temperature", [-0.1, 2.01, 3])
    def test_temperature_outside_0_to_2_is_invalid(self, temperature: float) -> None:
        body = {"model": "m", "messages": [USER], "temperature": temperature}
        assert chat_error(body).param == "temperature"

    @pytest.mark.parametrize("top_p", [0, 1.5])
    def test_top_p_outside_0_exclusive_to_1_is_invalid(self, top_p: float) -> None:
        assert chat_error({"model": "m", "messages": [USER], "top_p": top_p}).param == "top_p"

    @pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
    def test_max_tokens_below_1_is_invalid(self, field: str) -> None:
        assert chat_error({"model": "m", "messages": [USER], field: 0}).param == field

    @pytest.mark.parametrize("n", [0, 129])
    def test_n_outside_1_to_128_is_invalid(self, n: int) -> None:
        assert chat_error({"model": "m", "messages": [USER], "n": n}).param == "n"

    def test_empty_messages_is_invalid(self) -> None:
        assert chat_error({"model": "m", "messages": []}).param == "messages"

    def test_unknown_role_names_the_message(self) -> None:
        body = {"model": "m", "messages": [USER, {"role": "robot", "content": "x"}]}
        assert chat_error(body).param == "messages[1].role"

    def test_user_message_without_content_is_invalid(self) -> None:
        body = {"model": "m", "messages": [{"role": "user"}]}
        with pytest.raises(InvalidRequest, match="need `content`"):
            chat_to_preprocess(parse_chat(msgspec.json.encode(body)), **_IDS)

    def test_image_parts_travel_to_the_preprocessor_naming_their_place(self) -> None:
        parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]
        body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
        preprocess = chat_to_preprocess(parse_chat(msgspec.json.encode(body)), **_IDS)
        assert preprocess.messages[0]["content"] == [
            {"type": "text", "text": "hi"},
            {"type": "image_url", "image_url": {"url": "x"}, "param": "messages[0].content[1]"},
        ]

    def test_other_content_parts_are_invalid(self) -> None:
        parts = [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]
        body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
        with pytest.raises(InvalidRequest, match="only `text` and `image_url`") as caught:
            chat_to_preprocess(parse_chat(msgspec.json.encode(body)), **_IDS)
        assert caught.value.param == "messages[0].content[0]"

    def test_more_than_four_stop_sequences_is_invalid(self) -> None:
        body = {"model": "m", "messages": [USER], "stop": ["a", "b", "c", "d", "e"]}
        assert chat_error(body).param == "stop"

    def test_integer_logprobs_are_invalid_for_chat(self) -> None:
        assert chat_error({"model": "m", "messages": [USER], "logprobs": 2}).param == "logprobs"

    def test_unknown_fields_are_refused_naming_them(self) -> None:
        error = chat_error({"model": "m", "messages": [USER], "frobnicate": 1, "zap": 2})
        assert error.param == "frobnicate"
        assert "`frobnicate`, `zap`" in error.message

    def test_unknown_fields_are_ignored_when_allowed(self) -> None:
        body = msgspec.json.encode({"model": "m", "messages": [USER], "frobnicate": 1})
        assert parse_chat(body, allow_unknown=True).model == "m"

    def test_explicit_nulls_mean_defaults(self) -> None:
        request = chat(stream=None, n=None, temperature=None, stop=None)
        assert (request.output.stream, request.sampling.temperature) == (False, 1.0)


_IDS: dict[str, Any] = {"request_id": "r1", "reply_to": "gw.r1", "created": 7}


class TestChatMapping:
    def test_defaults_leave_max_tokens_to_the_preprocessor(self) -> None:
        request = chat()
        assert (request.api, request.model, request.max_tokens) == ("chat", "m", None)

    def test_ids_and_reply_subject_are_carried(self) -> None:
        request = chat()
        assert (request.request_id, request.reply_to, request.created) == ("r1", "gw.r1", 7)

    def test_max_completion_tokens_wins_over_max_tokens(self) -> None:
        request = chat(max_tokens=5, max_completion_tokens=9)
        assert (request.max_tokens, request.sampling.max_tokens) == (9, 9)

    def test_sampling_fields_and_vllm_extensions_are_mapped(self) -> None:
        request = chat(
            temperature=0,
            top_p=0.9,
            top_k=40,
            seed=3,
            min_tokens=2,
            ignore_eos=True,
            stop_token_ids=[7, 8],
            presence_penalty=0.5,
            frequency_penalty=-0.5,
        )
        s = request.sampling
        assert (s.temperature, s.top_p, s.top_k, s.seed, s.min_tokens) == (0.0, 0.9, 40, 3, 2)
        assert (s.ignore_eos, s.stop_token_ids) == (True, (7, 8))
        assert (s.presence_penalty, s.frequency_penalty) == (0.5, -0.5)

    def test_top_k_zero_means_disabled(self) -> None:
        assert chat(top_k=0).sampling.top_k == -1

    def test_stop_string_becomes_a_one_tuple(self) -> None:
        assert chat(stop="END").output.stop == ("END",)

    def test_stream_options_apply_only_when_streaming(self) -> None:
        options = {"include_usage": True, "continuous_usage_stats": True}
        streamed, plain = chat(stream=True, stream_options=options), chat(stream_options=options)
        assert (streamed.output.include_usage, streamed.output.continuous_usage) == (True, True)
        assert plain.output.include_usage is False

    def test_output_flags_are_mapped(self) -> None:
        out = chat(include_stop_str_in_output=True, skip_special_tokens=False).output
        assert (out.include_stop_str_in_output, out.skip_special_tokens) == (True, False)

    def test_text_parts_are_joined_with_newlines(self) -> None:
        parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        request = chat(messages=[{"role": "user", "content": parts}])
        assert request.messages == ({"role": "user", "content": "a\nb"},)

    def test_tool_and_reasoning_keys_are_kept(self) -> None:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages = [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "r"},
            {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
        ]
        request = chat(messages=messages)
        assert request.messages[1] == {
            "role": "assistant",
            "content": None,
            "tool_calls": [call],
            "reasoning_content": "r",
        }
        assert request.messages[2] == {
            "role": "tool",
            "content": "42",
            "tool_call_id": "c1",
            "name": "f",
        }

    def test_deprecated_functions_answer_one_function_call(self) -> None:
        function = {"name": "f", "parameters": {"type": "object", "properties": {}}}
        messages = [
            USER,
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "f", "arguments": "{}"},
            },
            {"role": "function", "name": "f", "content": "42"},
        ]
        request = chat(messages=messages, functions=[function])
        assert request.output.legacy_functions
        assert request.sampling.guided is not None
        assert request.sampling.guided.parallel_tool_calls is False
        assert request.messages[1]["tool_calls"] == [
            {"type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
        assert request.messages[2] == {"role": "tool", "content": "42", "name": "f"}
        assert not chat(tools=[{"type": "function", "function": function}]).output.legacy_functions

    def test_tools_are_passed_unless_tool_choice_is_none(self) -> None:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        assert chat(tools=tools).tools == tuple(tools)
        assert chat(tools=tools).sampling.guided is not None
        assert chat(tools=tools, tool_choice="none").tools is None

    def test_template_options_are_passed(self) -> None:
        request = chat(
            chat_template_kwargs={"enable_thinking": False},
            add_generation_prompt=False,
            continue_final_message=True,
        )
        assert request.chat_template_kwargs == {"enable_thinking": False}
        assert (request.add_generation_prompt, request.continue_final_message) == (False, True)

    def test_preprocess_survives_the_bus_codec(self) -> None:
        from shared import codec

        request = chat(stream=True, stop=["x"], temperature=0.2)
        assert codec.decode(codec.encode(request), Preprocess) == request


class TestCompletion:
    def test_string_prompt_is_carried(self) -> None:
        request = completion()
        assert (request.api, request.prompt, request.prompt_token_ids) == (
            "completion",
            "hello",
            None,
        )

    def test_one_element_string_list_is_the_prompt(self) -> None:
        assert completion(prompt=["hey"]).prompt == "hey"

    def test_token_ids_become_prompt_token_ids(self) -> None:
        request = completion(prompt=[1, 2, 3])
        assert (request.prompt, request.prompt_token_ids) == (None, (1, 2, 3))

    def test_several_prompts_are_a_batch_of_one_prompt_each(self) -> None:
        assert prompts(["a", "b"]) == ["a", "b"]
        assert prompts([[1], [2, 3]]) == [[1], [2, 3]]
        assert prompts(["a"]) == [["a"]]
        assert prompts([1, 2]) == [[1, 2]]

    def test_one_request_of_a_batch_is_made_per_prompt_not_for_the_batch(self) -> None:
        with pytest.raises(InvalidRequest, match="a list of several strings") as caught:
            completion(prompt=["a", "b"])
        assert caught.value.param == "prompt"

    @pytest.mark.parametrize("prompt", ["", [], [1, "a"], [-1], [True], {"a": 1}])
    def test_bad_prompt_is_invalid(self, prompt: Any) -> None:
        with pytest.raises(InvalidRequest) as caught:
            completion(prompt=prompt)
        assert caught.value.param == "prompt"

    def test_echo_and_max_tokens_are_mapped(self) -> None:
        request = completion(echo=True, max_tokens=3)
        assert (request.output.echo, request.max_tokens) == (True, 3)


class TestCompletionFromValues:
    """The gRPC front end validates its values as a completion body is validated."""

    def test_values_become_a_text_output_preprocess(self) -> None:
        request = completion_from({"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True})
        preprocess = completion_to_preprocess(
            request, request_id="r1", reply_to="gw.r1", created=7, output_format="text"
        )
        assert (preprocess.max_tokens, preprocess.output.stream) == (3, True)
        assert preprocess.output.format == "text"

    def test_out_of_range_value_names_the_field(self) -> None:
        with pytest.raises(InvalidRequest, match="temperature") as caught:
            completion_from({"model": "m", "prompt": "hi", "temperature": 2.5})
        assert caught.value.param == "temperature"

    def test_wrong_type_names_the_field(self) -> None:
        with pytest.raises(InvalidRequest) as caught:
            completion_from({"model": "m", "prompt": "hi", "max_tokens": 1.5})
        assert caught.value.param == "max_tokens"

    def test_too_many_stop_strings_are_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="at most 4"):
            completion_from({"model": "m", "prompt": "hi", "stop": list("abcde")})
