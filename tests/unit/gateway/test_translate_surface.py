"""The OpenAI request surface: tools, structured outputs, n / logprobs, sampling breadth and the
rest of Dynamo's ``nvext``, validated and mapped onto ``Preprocess``."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.gateway.apis.openai import (
    NO_HEADERS,
    RoutingHeaders,
    UnknownField,
    chat_from,
    chat_to_preprocess,
    completion_to_preprocess,
    parse_chat,
    parse_completion,
)
from shared import codec
from shared.errors import InvalidRequest
from shared.messages import Guided, Preprocess, RoutingHints

USER = {"role": "user", "content": "hi"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
IDS: dict[str, Any] = {"request_id": "r1", "reply_to": "gw.r1", "created": 7}


def chat(headers: RoutingHeaders = NO_HEADERS, **fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "messages": [USER], **fields})
    return chat_to_preprocess(parse_chat(body), headers=headers, **IDS)


def completion(**fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "prompt": "hello", **fields})
    return completion_to_preprocess(parse_completion(body), **IDS)


def chat_error(**fields: Any) -> InvalidRequest:
    body = msgspec.json.encode({"model": "m", "messages": [USER], **fields})
    with pytest.raises(InvalidRequest) as caught:
        chat_to_preprocess(parse_chat(body), **IDS)
    return caught.value


def completion_error(**fields: Any) -> InvalidRequest:
    body = msgspec.json.encode({"model": "m", "prompt": "hello", **fields})
    with pytest.raises(InvalidRequest) as caught:
        parse_completion(body)
    return caught.value


class TestTools:
    def test_tools_default_to_auto_and_reach_template_and_engine(self) -> None:
        req = chat(tools=[WEATHER, TIME])
        # No `parameters` means an empty parameter list (OpenAI), written out.
        time_fn = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
        assert req.tools == (WEATHER, {"type": "function", "function": time_fn})
        guided = req.sampling.guided
        assert guided == Guided(
            tools=(WEATHER["function"], time_fn),
            tool_choice="auto",
            parallel_tool_calls=True,
        )

    def test_required_and_parallel_tool_calls(self) -> None:
        guided = chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
        assert guided.sampling.guided is not None
        assert guided.sampling.guided.tool_choice == "required"
        assert guided.sampling.guided.parallel_tool_calls is False

    def test_named_tool_choice_is_the_function_name(self) -> None:
        choice = {"type": "function", "function": {"name": "get_time"}}
        guided = chat(tools=[WEATHER, TIME], tool_choice=choice).sampling.guided
        assert guided is not None
        assert guided.tool_choice == "get_time"

    def test_tool_choice_none_sends_no_tools(self) -> None:
        req = chat(tools=[WEATHER], tool_choice="none")
        assert (req.tools, req.sampling.guided) == (None, None)

    def test_named_function_must_be_one_of_the_tools(self) -> None:
        choice = {"type": "function", "function": {"name": "launch"}}
        error = chat_error(tools=[WEATHER], tool_choice=choice)
        assert error.param == "tool_choice"
        assert "`launch`" in error.message
        assert "`get_weather`" in error.message

    @pytest.mark.parametrize(
        "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
    )
    def test_required_or_named_without_tools_is_invalid(self, choice: Any) -> None:
        assert chat_error(tool_choice=choice).param == "tool_choice"

    def test_auto_without_tools_is_accepted(self) -> None:
        assert chat(tool_choice="auto").sampling.guided is None

    @pytest.mark.parametrize(
        ("tool", "param"),
        [
            ({"type": "function", "function": {"name": "bad name"}}, "tools[0].function.name"),
            ({"type": "function", "function": {"name": "x" * 65}}, "tools[0].function.name"),
            ({"type": "function", "function": {"name": ""}}, "tools[0].function.name"),
            ({"type": "custom", "custom": {"name": "x"}}, "tools[0].type"),
            ({"type": "function"}, "tools[0].function"),
            ({"type": "function", "function": {"name": "f", "parameters": 3}}, None),
        ],
    )
    def test_malformed_tools_are_invalid(self, tool: dict[str, Any], param: str | None) -> None:
        error = chat_error(tools=[tool])
        assert error.param == (param or "tools[0].function.parameters")

    def test_unknown_tool_choice_string_is_invalid(self) -> None:
        assert chat_error(tools=[WEATHER], tool_choice="sometimes").param == "tool_choice"

    def test_duplicate_function_names_are_invalid(self) -> None:
        assert chat_error(tools=[WEATHER, WEATHER]).param == "tools[1].function.name"

    def test_legacy_functions_are_read_as_tools(self) -> None:
        req = chat(functions=[WEATHER["function"]], function_call={"name": "get_weather"})
        assert req.tools == (WEATHER,)
        assert req.sampling.guided is not None
        assert req.sampling.guided.tool_choice == "get_weather"

    def test_both_tool_forms_are_refused(self) -> None:
        error = chat_error(tools=[WEATHER], functions=[WEATHER["function"]])
        assert error.param == "functions"

    def test_legacy_assistant_function_call_becomes_tool_calls(self) -> None:
        call = {"name": "get_weather", "arguments": "{}"}
        messages = [USER, {"role": "assistant", "function_call": call}]
        req = chat(messages=messages)
        assert req.messages[1]["tool_calls"] == [{"type": "function", "function": call}]


class TestResponseFormat:
    def test_json_schema_reaches_the_engine(self) -> None:
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}
        guided = chat(response_format=fmt).sampling.guided
        assert guided is not None
        assert (guided.json_schema, guided.json_object, guided.tools) == (schema, False, ())

    def test_json_object(self) -> None:
        guided = chat(response_format={"type": "json_object"}).sampling.guided
        assert guided is not None
        assert guided.json_object is True

    def test_text_constrains_nothing(self) -> None:
        assert chat(response_format={"type": "text"}).sampling.guided is None

    @pytest.mark.parametrize(
        ("fmt", "param"),
        [
            ({"type": "yaml"}, "response_format.type"),
            ({"type": "json_schema"}, "response_format.json_schema"),
            (
                {"type": "json_schema", "json_schema": {"schema": {}}},
                "response_format.json_schema.name",
            ),
            (
                {"type": "json_schema", "json_schema": {"name": "a b"}},
                "response_format.json_schema.name",
            ),
            ("json", "response_format"),
        ],
    )
    def test_malformed_formats_are_invalid(self, fmt: Any, param: str) -> None:
        assert chat_error(response_format=fmt).param == param


class TestChoicesAndLogprobs:
    def test_n_reaches_sampling_and_output(self) -> None:
        req = chat(n=3, stream=True)
        assert (req.sampling.n, req.output.n) == (3, 3)

    def test_chat_logprobs_with_top_logprobs(self) -> None:
        req = chat(logprobs=True, top_logprobs=5)
        assert (req.sampling.logprobs, req.output.logprobs) == (5, 5)
        assert chat(logprobs=True).output.logprobs == 0
        assert chat(logprobs=False).output.logprobs is None

    @pytest.mark.parametrize("top", [-1, 21])
    def test_top_logprobs_range(self, top: int) -> None:
        assert chat_error(logprobs=True, top_logprobs=top).param == "top_logprobs"

    def test_top_logprobs_needs_logprobs(self) -> None:
        error = chat_error(top_logprobs=2)
        assert (error.param, error.message) == (
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`.",
        )

    def test_completion_logprobs_are_a_count(self) -> None:
        req = completion(logprobs=3, n=2)
        assert (req.sampling.logprobs, req.output.logprobs, req.output.n) == (3, 3, 2)

    @pytest.mark.parametrize("value", [6, -1, True])
    def test_completion_logprobs_range(self, value: Any) -> None:
        assert completion_error(logprobs=value).param == "logprobs"

    def test_best_of_equal_to_n_is_accepted(self) -> None:
        assert completion(best_of=2, n=2).sampling.n == 2
        assert completion(best_of=1).sampling.n == 1

    def test_best_of_other_than_n_is_refused_clearly(self) -> None:
        error = completion_error(best_of=3, n=1)
        assert error.param == "best_of"
        assert "not supported" in error.message

    def test_suffix_is_refused(self) -> None:
        assert completion_error(suffix="end").param == "suffix"
        assert completion(suffix="").prompt == "hello"


class TestSampling:
    def test_penalties_min_p_and_logit_bias(self) -> None:
        req = chat(
            presence_penalty=2,
            frequency_penalty=-2,
            repetition_penalty=1.2,
            min_p=0.05,
            logit_bias={"42": -100, "7": 5.5},
        )
        s = req.sampling
        assert (s.presence_penalty, s.frequency_penalty) == (2.0, -2.0)
        assert (s.repetition_penalty, s.min_p) == (1.2, 0.05)
        assert s.logit_bias == {42: -100.0, 7: 5.5}

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"presence_penalty": 2.1}, "presence_penalty"),
            ({"frequency_penalty": -2.5}, "frequency_penalty"),
            ({"repetition_penalty": 0}, "repetition_penalty"),
            ({"min_p": 1.5}, "min_p"),
            ({"logit_bias": {"1": 101}}, "logit_bias"),
            ({"logit_bias": {"hello": 1}}, "logit_bias"),
            ({"logit_bias": {"-3": 1}}, "logit_bias"),
            ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ],
    )
    def test_out_of_range_values_name_the_field(self, fields: dict[str, Any], param: str) -> None:
        assert chat_error(**fields).param == param

    def test_defaults(self) -> None:
        s = chat().sampling
        assert (s.n, s.logprobs, s.min_p, s.repetition_penalty, s.logit_bias) == (
            1,
            None,
            0.0,
            1.0,
            None,
        )
        assert (s.greedy, s.guided) == (False, None)


class TestNvext:
    def test_annotations_known_ones_in_order(self) -> None:
        ann = ["token_ids", "query_instance_id:x", "request_id", "token_ids", "formatted_prompt"]
        req = chat(nvext={"annotations": ann}, stream=True)
        assert req.output.annotations == ("token_ids", "request_id", "formatted_prompt")

    def test_token_data_is_the_prompt_for_chat_and_completions(self) -> None:
        assert chat(nvext={"token_data": [1, 2, 3]}).prompt_token_ids == (1, 2, 3)
        req = completion(nvext={"token_data": [4, 5]})
        assert (req.prompt, req.prompt_token_ids) == (None, (4, 5))

    @pytest.mark.parametrize("data", [[], [-1], [2**32], ["a"]])
    def test_bad_token_data_is_invalid(self, data: list[Any]) -> None:
        assert chat_error(nvext={"token_data": data}).param.startswith("nvext.token_data")

    def test_use_raw_prompt_greed_sampling_and_max_thinking_tokens(self) -> None:
        req = chat(nvext={"use_raw_prompt": True, "greed_sampling": True, "max_thinking_tokens": 9})
        assert (req.use_raw_prompt, req.sampling.greedy) == (True, True)
        assert req.sampling.guided == Guided(max_thinking_tokens=9)
        tools = chat(tools=[WEATHER], nvext={"max_thinking_tokens": 4}).sampling.guided
        assert tools is not None
        assert (tools.max_thinking_tokens, tools.tool_choice) == (4, "auto")
        done = completion(nvext={"max_thinking_tokens": 2, "use_raw_prompt": True})
        assert done.sampling.guided == Guided(max_thinking_tokens=2)
        assert done.use_raw_prompt is True

    def test_allowed_worker_ids_become_routing_hints(self) -> None:
        req = chat(nvext={"allowed_worker_ids": ["w2", 7, "w2"]})
        assert req.routing == RoutingHints(allowed_worker_ids=("7", "w2"))
        assert req.worker_id is None

    @pytest.mark.parametrize(
        ("ids", "param"),
        [
            ([], "nvext.allowed_worker_ids"),
            (["ok", "no.dots"], "nvext.allowed_worker_ids[1]"),
            ("w1", "nvext.allowed_worker_ids"),
        ],
    )
    def test_bad_allowed_worker_ids(self, ids: Any, param: str) -> None:
        assert chat_error(nvext={"allowed_worker_ids": ids}).param == param

    def test_pinned_worker_must_be_allowed(self) -> None:
        ext = {"allowed_worker_ids": ["w1"], "backend_instance_id": "w2"}
        assert chat_error(nvext=ext).param == "nvext.allowed_worker_ids"
        pinned = chat(RoutingHeaders(worker_instance_id="w1"), nvext={"allowed_worker_ids": ["w1"]})
        assert pinned.worker_id == "w1"

    def test_dynamo_fields_without_effect_are_accepted(self) -> None:
        ext = {"session_control": {}, "routing_constraints": {}, "request_timestamp_ms": 1.0}
        assert chat(nvext=ext).routing is None

    def test_agent_hints_reach_the_router(self) -> None:
        assert chat(nvext={"agent_hints": {"osl": 10}}).routing == RoutingHints(osl=10)

    def test_disaggregation_pins_reach_the_router(self) -> None:
        ext = {"prefill_worker_id": 3, "decode_worker_id": "d1", "dp_rank": 1, "prefill_dp_rank": 0}
        request = chat(nvext=ext)
        assert request.worker_id == "d1"
        assert request.routing == RoutingHints(
            prefill_worker_id="3",
            dp_rank=1,
            prefill_dp_rank=0,
            decode_worker_id_param="nvext.decode_worker_id",
        )

    def test_a_header_pin_is_named_by_its_header(self) -> None:
        request = chat(RoutingHeaders(worker_instance_id="w1"))
        assert request.routing is not None
        assert request.routing.decode_worker_id_param == "x-worker-instance-id"

    @pytest.mark.parametrize(
        ("ext", "param"),
        [
            ({"decode_worker_id": "a", "backend_instance_id": "b"}, "nvext.decode_worker_id"),
            ({"prefill_worker_id": "a.b"}, "nvext.prefill_worker_id"),
            ({"dp_rank": -1}, None),
            ({"prefill_dp_rank": "x"}, None),
        ],
    )
    def test_bad_pins_are_400(self, ext: dict[str, Any], param: str | None) -> None:
        with pytest.raises((InvalidRequest, msgspec.ValidationError)) as caught:
            chat(nvext=ext)
        if param is not None:
            assert getattr(caught.value, "param", None) == param

    @pytest.mark.parametrize("annotation", ["query_instance_id", "query_instance_id:epp-1"])
    def test_query_instance_id_asks_where_the_request_would_go(self, annotation: str) -> None:
        request = chat(nvext={"annotations": [annotation]})
        assert request.routing is not None
        assert request.routing.query_only
        assert request.output.annotations == ()  # not an SSE event frame


class TestStrictness:
    def test_documented_openai_fields_are_accepted(self) -> None:
        req = chat(
            user="u",
            metadata={"k": "v"},
            store=False,
            service_tier="auto",
            safety_identifier="s",
            prompt_cache_key="k",
            prediction={"type": "content", "content": "x"},
            reasoning_effort="low",
            verbosity="low",
            web_search_options={},
            modalities=["text"],
        )
        assert req.model == "m"

    def test_audio_output_is_refused(self) -> None:
        assert chat_error(modalities=["text", "audio"]).param == "modalities"
        assert chat_error(audio={"voice": "alloy", "format": "mp3"}).param == "audio"

    def test_unknown_completion_field_is_refused(self) -> None:
        error = completion_error(use_beam_search=True)
        assert isinstance(error, UnknownField)
        assert (error.param, error.code) == ("use_beam_search", "unknown_parameter")

    def test_unknown_field_error_body_names_it(self) -> None:
        error = chat_error(foo=1)
        body = msgspec.json.decode(error.body())
        assert body["error"]["param"] == "foo"
        assert body["error"]["type"] == "invalid_request_error"

    def test_relaxed_mode_still_validates_known_fields(self) -> None:
        body = msgspec.json.encode({"model": "m", "messages": [USER], "foo": 1, "n": 0})
        with pytest.raises(InvalidRequest) as caught:
            parse_chat(body, allow_unknown=True)
        assert caught.value.param == "n"

    def test_nested_unknown_keys_are_ignored(self) -> None:
        messages = [{"role": "user", "content": "hi", "extra": 1}]
        assert chat(messages=messages, stream_options={"x": 1}).model == "m"

    def test_chat_from_values_validates_like_a_body(self) -> None:
        with pytest.raises(InvalidRequest) as caught:
            chat_from({"model": "m", "messages": [USER], "tool_choice": "required"})
        assert caught.value.param == "tool_choice"
        assert chat_from({"model": "m", "messages": [USER], "n": 2}).n == 2

    def test_everything_survives_the_bus_codec(self) -> None:
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object"}}}
        req = chat(
            tools=[WEATHER],
            tool_choice="required",
            response_format=fmt,
            n=2,
            logprobs=True,
            top_logprobs=3,
            logit_bias={"5": 1},
            nvext={"annotations": ["request_id"], "allowed_worker_ids": ["a"], "token_data": [1]},
        )
        assert codec.decode(codec.encode(req), Preprocess) == req


class TestBusLimits:
    """Every integer goes on the bus in MessagePack: too big for 64 bits is a 400, not a 500
    when the gateway publishes (found by the fuzz run)."""

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"seed": -(2**63) - 1}, "seed"),
            ({"seed": 2**63}, "seed"),
            ({"top_k": 2**70}, "top_k"),
            ({"min_tokens": 2**64}, "min_tokens"),
            ({"max_tokens": 2**63}, "max_tokens"),
            ({"stop_token_ids": [2**40]}, "stop_token_ids[0]"),
            ({"chat_template_kwargs": {"a": [1, 2**64]}}, "chat_template_kwargs"),
            (
                {"tools": [{**WEATHER, "function": {"name": "f", "parameters": {"x": -(2**64)}}}]},
                "tools[0].function.parameters",
            ),
            (
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "n", "schema": {"maxLength": 2**65}},
                    }
                },
                "response_format.json_schema.schema",
            ),
            (
                {
                    "messages": [
                        USER,
                        {"role": "assistant", "tool_calls": [{"id": 2**64, "type": "function"}]},
                    ]
                },
                "messages[1].tool_calls",
            ),
        ],
    )
    def test_integers_beyond_64_bits_are_400s(self, fields: dict[str, Any], param: str) -> None:
        assert chat_error(**fields).param == param

    def test_64_bit_extremes_reach_the_bus(self) -> None:
        req = chat(seed=-(2**63), chat_template_kwargs={"n": 2**64 - 1})
        assert codec.decode(codec.encode(req), Preprocess) == req

    def test_huge_prompt_token_ids_are_refused(self) -> None:
        assert completion_error(prompt=[1, 2**64]).param == "prompt"
