"""Chat template rendering, checked against strings worked out by hand from Qwen3's template."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from services.preprocessor import chat_template
from services.preprocessor.chat_template import normalize_messages, render, select_template
from shared.errors import InternalError, InvalidRequest

QWEN_SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo <now> & later",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# transformers' tojson: key order kept, no HTML escaping, non-ASCII kept, ", " / ": ".
WEATHER_TOOL_JSON = (
    '{"type": "function", "function": {"name": "get_weather", "description": '
    '"Météo <now> & later", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}}, "required": ["city"]}}}'
)


def qwen(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return render(template, normalize_messages(messages), special_tokens=QWEN_SPECIAL, **kwargs)


class TestQwen3Template:
    def test_system_and_user_with_generation_prompt(self, qwen_template: str) -> None:
        messages = [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Hi"},
        ]
        assert qwen(qwen_template, messages) == (
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def test_no_generation_prompt(self, qwen_template: str) -> None:
        text = qwen(qwen_template, [{"role": "user", "content": "Hi"}], add_generation_prompt=False)
        assert text == "<|im_start|>user\nHi<|im_end|>\n"

    def test_enable_thinking_false_adds_empty_think_block(self, qwen_template: str) -> None:
        text = qwen(
            qwen_template,
            [{"role": "user", "content": "Hi"}],
            template_kwargs={"enable_thinking": False},
        )
        assert text == (
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )

    def test_tools_are_rendered_into_the_system_prompt(self, qwen_template: str) -> None:
        messages = [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Weather in Paris?"},
        ]
        assert qwen(qwen_template, messages, tools=[WEATHER_TOOL]) == (
            "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more "
            "functions to assist with the user query.\n\nYou are provided with function "
            "signatures within <tools></tools> XML tags:\n<tools>\n"
            + WEATHER_TOOL_JSON
            + "\n</tools>\n\nFor each function call, return a json object with function name "
            "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def test_multi_part_content_is_joined_with_newlines(self, qwen_template: str) -> None:
        content = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
        text = qwen(qwen_template, [{"role": "user", "content": content}])
        assert text == "<|im_start|>user\nHello\nworld<|im_end|>\n<|im_start|>assistant\n"

    def test_tool_call_history_renders_arguments_as_json(self, qwen_template: str) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        ]
        assert qwen(qwen_template, messages) == (
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def test_reasoning_is_dropped_from_earlier_turns(self, qwen_template: str) -> None:
        messages = [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
            {"role": "user", "content": "times 3?"},
        ]
        assert qwen(qwen_template, messages) == (
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\ntimes 3?<|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def test_continue_final_message_stops_after_its_text(self, qwen_template: str) -> None:
        messages = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "The answer is"},
        ]
        text = qwen(
            qwen_template, messages, add_generation_prompt=False, continue_final_message=True
        )
        assert text == (
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is"
        )

    def test_continue_final_message_with_generation_prompt_is_rejected(
        self, qwen_template: str
    ) -> None:
        with pytest.raises(InvalidRequest, match="cannot both be true"):
            qwen(qwen_template, [{"role": "user", "content": "Hi"}], continue_final_message=True)

    def test_reserved_kwargs_cannot_replace_the_messages(self, qwen_template: str) -> None:
        text = qwen(
            qwen_template,
            [{"role": "user", "content": "Hi"}],
            template_kwargs={"messages": [], "add_generation_prompt": False},
        )
        assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


class TestEnvironment:
    """The jinja set-up matches transformers'."""

    def test_tojson_keeps_order_and_does_not_escape(self) -> None:
        out = render("{{ messages[0] | tojson }}", [{"b": 1, "a": "é<&'"}])
        assert out == '{"b": 1, "a": "é<&\'"}'

    def test_tojson_takes_indent(self) -> None:
        out = render("{{ messages[0] | tojson(indent=2) }}", [{"b": 1, "a": [2]}])
        assert out == '{\n  "b": 1,\n  "a": [\n    2\n  ]\n}'

    def test_tojson_takes_separators_and_sort_keys(self) -> None:
        source = "{{ messages[0] | tojson(separators=(',', ':'), sort_keys=true) }}"
        assert render(source, [{"b": 1, "a": 2}]) == '{"a":2,"b":1}'

    def test_raise_exception_is_a_400(self) -> None:
        source = "{% if messages[0].role != 'user' %}{{ raise_exception('roles must alternate') }}"
        source += "{% endif %}"
        with pytest.raises(InvalidRequest, match="roles must alternate") as info:
            render(source, [{"role": "assistant", "content": "x"}])
        assert info.value.status == 400

    def test_sandbox_blocks_mutation(self) -> None:
        with pytest.raises(InvalidRequest, match="chat template error"):
            render("{{ messages.append(1) }}", [])

    def test_trim_and_lstrip_blocks(self) -> None:
        assert render("  {% if true %}\nyes\n  {% endif %}\n", []) == "yes\n"

    def test_loop_controls(self) -> None:
        source = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.c }}"
        source += "{% endfor %}"
        assert render(source, [{"c": "a"}, {"c": "b"}]) == "a"

    def test_generation_tag_renders_its_body(self) -> None:
        source = "{% generation %}hi {{ messages[0].c }}{% endgeneration %}"
        assert render(source, [{"c": "there"}]) == "hi there"

    def test_strftime_now(self) -> None:
        assert render("{{ strftime_now('%Y') }}", []) == datetime.now().strftime("%Y")

    def test_special_tokens_are_variables(self) -> None:
        source = "{{ eos_token }}|{{ bos_token is defined }}"
        assert render(source, [], special_tokens=QWEN_SPECIAL) == "<|im_end|>|False"

    def test_template_is_compiled_once(self) -> None:
        source = "{{ messages | length }}"
        assert chat_template.compile_template(source) is chat_template.compile_template(source)

    def test_broken_template_is_an_internal_error(self) -> None:
        with pytest.raises(InternalError, match="does not compile"):
            chat_template.compile_template("{% if %}")

    def test_type_error_in_template_is_a_400(self) -> None:
        with pytest.raises(InvalidRequest, match="failed on these messages"):
            render("{{ messages[0].c + 1 }}", [{"c": "x"}])


class TestMessages:
    def test_none_content_becomes_empty(self) -> None:
        assert normalize_messages([{"role": "assistant", "content": None}]) == [
            {"role": "assistant", "content": ""}
        ]

    def test_unknown_keys_are_dropped_and_name_kept(self) -> None:
        messages = [{"role": "user", "content": "x", "name": "bob", "extra": 1}]
        assert normalize_messages(messages) == [{"role": "user", "content": "x", "name": "bob"}]

    def test_empty_tool_call_arguments_become_an_object(self) -> None:
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
        [message] = normalize_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
        assert message["tool_calls"][0]["function"]["arguments"] == {}

    def test_bad_tool_call_json_is_a_400(self) -> None:
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}
        with pytest.raises(InvalidRequest, match="not valid JSON"):
            normalize_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])

    def test_image_parts_stay_in_a_list_for_vision_templates(self) -> None:
        content = [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "x"}},
        ]
        (message,) = normalize_messages([{"role": "user", "content": content}])
        assert message["content"] == [{"type": "text", "text": "see"}, {"type": "image"}]

    def test_other_parts_are_rejected(self) -> None:
        content = [{"type": "input_audio", "input_audio": {}}]
        with pytest.raises(InvalidRequest, match="input_audio"):
            normalize_messages([{"role": "user", "content": content}])

    def test_message_without_role_is_rejected(self) -> None:
        with pytest.raises(InvalidRequest, match="role"):
            normalize_messages([{"content": "x"}])


class TestSelectTemplate:
    def test_tool_use_template_when_tools_are_given(self) -> None:
        assert select_template({"default": "d", "tool_use": "t"}, has_tools=True) == "t"

    def test_default_template_without_tools(self) -> None:
        assert select_template({"default": "d", "tool_use": "t"}, has_tools=False) == "d"

    def test_no_template_is_a_400(self) -> None:
        with pytest.raises(InvalidRequest, match="no chat template"):
            select_template({}, has_tools=False)
