"""``--lora-modules`` parsing: vLLM's ``name=path`` and JSON forms, and the errors a user sees."""

from __future__ import annotations

import pytest

from shared.lora import LoraModule, parse_lora_modules
from shared.worker.config import WorkerConfig


def test_name_equals_path_items_in_order() -> None:
    assert parse_lora_modules("sql=/a/sql chat=/a/chat") == (
        LoraModule("sql", "/a/sql"),
        LoraModule("chat", "/a/chat"),
    )


def test_json_items_with_spaces_commas_and_a_base_model() -> None:
    text = '{"name": "sql", "path": "/a/sql", "base_model_name": "m"},x=/y'
    assert parse_lora_modules(text) == (LoraModule("sql", "/a/sql", "m"), LoraModule("x", "/y"))


def test_empty_means_none() -> None:
    assert parse_lora_modules(" \n ") == ()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("sql", "'sql' is not name=path"),
        ("=/p", "is not name=path"),
        ('{"name": "a"}', 'needs string "name" and "path"'),
        ('{"name": "a", "path": "/p", "rank": 8}', "unknown key(s) rank"),
        ('{"name": "a", ', "bad JSON item"),
        ("a=/p a=/q", "'a' is given twice"),
        ("bad name=/p", "is not name=path"),
        ("-x=/p", "adapter name '-x'"),
    ],
)
def test_bad_items_are_named(text: str, error: str) -> None:
    with pytest.raises(ValueError, match="--lora-modules") as caught:
        parse_lora_modules(text)
    assert error in str(caught.value)


def test_the_worker_flag_takes_several_arguments_as_vllm_does() -> None:
    config = WorkerConfig.from_cli(["--lora-modules", "a=/x", '{"name": "b", "path": "/y"}'])
    assert [m.name for m in config.adapters()] == ["a", "b"]
    assert config.max_loras == 1  # vLLM's default


def test_a_bad_item_stops_the_worker_at_start() -> None:
    with pytest.raises(SystemExit):
        WorkerConfig.from_cli(["--lora-modules", "nopath"])
