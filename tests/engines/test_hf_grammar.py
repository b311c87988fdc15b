"""Guided decoding of the transformers engine (``services.hf_worker.grammar``) with the real
Qwen3 tokenizer, xgrammar, and transformers' own continuous-batching types: the processor is
called as ``ContinuousBatchingLogitsProcessorList`` calls it (``prepare_tensor_args`` with
``FutureRequestState``s of real ``RequestState``s, then ``__call__(scores, tensor_arg)``), and
once through a real manager on the tiny random model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.hf_worker.grammar import Grammars, GrammarSpec, grammar_spec
from services.mocker.structured import format_calls
from shared.messages import Guided
from shared.worker.records import EngineError

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")
transformers = pytest.importorskip("transformers")
requests_mod = pytest.importorskip("transformers.generation.continuous_batching.requests")

VOCAB = 151936
EOS = (151645, 151643)
THINK_CLOSE = 151668
UNIT = {"type": "string", "enum": ["celsius", "fahrenheit"]}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"unit": UNIT, "detailed": {"type": "boolean"}},
        "required": ["unit", "detailed"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
    },
}
TOOLS = (WEATHER, TIME)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def grammars(tokenizer: Any) -> Grammars:
    return Grammars(tokenizer, vocab_size=VOCAB, stop_token_ids=EOS)


def spec(**fields: Any) -> GrammarSpec:
    made = grammar_spec(Guided(tool_syntax="hermes", reasoning_syntax="qwen3", **fields))
    assert made is not None
    return made


class Rows:
    """Requests in a batch as the manager holds them (``RequestState`` /
    ``FutureRequestState``), stepped through the processor as the manager steps them."""

    def __init__(self, grammars: Grammars) -> None:
        self.processor = grammars.processor or _bare_processor(grammars)
        self.states: dict[str, Any] = {}

    def add(self, request_id: str) -> None:
        self.states[request_id] = requests_mod.RequestState(
            request_id=request_id, initial_tokens=[1, 2, 3]
        )

    def step(self) -> Any:
        """One step's processed scores (all zeros in: what is left is the mask)."""
        futures = [requests_mod.FutureRequestState(s, True, {}, 1) for s in self.states.values()]
        arg = self.processor.prepare_tensor_args(futures)
        storage = torch.zeros(len(futures) + 2, dtype=torch.int32)  # the manager pads rows
        storage[: arg.size(0)] = arg
        return self.processor(torch.zeros(len(futures), VOCAB), storage)

    def allowed(self, scores: Any, row: int, token: int) -> bool:
        return bool(scores[row, token] > float("-inf"))

    def walk(self, request_id: str, ids: list[int]) -> int | None:
        """Feed ``ids`` one step each; the position of the first masked one (None: all
        allowed)."""
        row = list(self.states).index(request_id)
        for n, token in enumerate(ids):
            if not self.allowed(self.step(), row, token):
                return n
            self.states[request_id].generated_tokens.append(token)
        return None


def _bare_processor(grammars: Grammars) -> Any:
    from services.hf_worker.grammar import _make_processor

    return _make_processor(grammars, 4, "cpu")


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_a_plain_request_has_no_grammar() -> None:
    assert grammar_spec(None) is None
    assert grammar_spec(Guided(tools=TOOLS, tool_syntax="hermes")) is None  # auto: free text
    assert grammar_spec(Guided(max_thinking_tokens=8)) is None  # the model does not reason


def test_a_syntax_without_a_tag_is_a_400() -> None:
    with pytest.raises(EngineError, match="mistral"):
        grammar_spec(Guided(tools=TOOLS, tool_choice="required", tool_syntax="mistral"))


def test_an_invalid_schema_is_a_400(grammars: Grammars) -> None:
    bad = spec(json_schema={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    with pytest.raises(EngineError, match="cannot be compiled"):
        grammars.add("bad", bad)
    assert "bad" not in grammars


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_the_mockers_call_is_accepted_and_ends(
    grammars: Grammars, tokenizer: Any, choice: str
) -> None:
    name, args = ("get_time", {"zone": "CET"})
    text = format_calls("hermes", [(name, args)])
    grammars.add("r", spec(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False))
    rows = Rows(grammars)
    rows.add("r")
    try:
        assert rows.walk("r", [*encode(tokenizer, text), EOS[0]]) is None
    finally:
        grammars.discard("r")


def test_a_named_choice_refuses_another_function(grammars: Grammars, tokenizer: Any) -> None:
    other = format_calls("hermes", [("get_weather", {"unit": "celsius", "detailed": True})])
    grammars.add("r", spec(tools=TOOLS, tool_choice="get_time"))
    rows = Rows(grammars)
    rows.add("r")
    try:
        assert rows.walk("r", encode(tokenizer, other)) is not None
    finally:
        grammars.discard("r")


@pytest.mark.parametrize("parallel", [True, False])
def test_a_second_call_only_when_parallel_calls_are_allowed(
    grammars: Grammars, tokenizer: Any, parallel: bool
) -> None:
    calls: list[tuple[str, dict[str, object]]] = [
        ("get_time", {"zone": "UTC"}),
        ("get_weather", {"unit": "celsius", "detailed": False}),
    ]
    text = format_calls("hermes", calls)
    grammars.add("r", spec(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel))
    rows = Rows(grammars)
    rows.add("r")
    try:
        refused_at = rows.walk("r", [*encode(tokenizer, text), EOS[0]])
    finally:
        grammars.discard("r")
    first = len(encode(tokenizer, format_calls("hermes", calls[:1])))
    assert refused_at == (None if parallel else first)  # the separator of a second call


def test_the_thinking_budget_forces_the_end_of_reasoning(
    grammars: Grammars, tokenizer: Any
) -> None:
    budget = 5
    thought = encode(
        tokenizer, "<think>\nThe user wants the time. Let me think about it at length."
    )
    grammars.add(
        "r", spec(tools=TOOLS, tool_choice="get_time", thinking=True, max_thinking_tokens=budget)
    )
    rows = Rows(grammars)
    rows.add("r")
    try:
        refused_at = rows.walk("r", thought)
        assert refused_at == 1 + budget  # <think>, then `budget` tokens of thought
        assert rows.allowed(rows.step(), 0, THINK_CLOSE)
    finally:
        grammars.discard("r")


def test_json_is_constrained_after_the_reasoning(grammars: Grammars, tokenizer: Any) -> None:
    answer = "<think>\nHmm.\n</think>\n\n" + json.dumps({"unit": "celsius", "detailed": True})
    grammars.add("r", spec(json_schema=WEATHER["parameters"], thinking=True))
    rows = Rows(grammars)
    rows.add("r")
    try:
        assert rows.walk("r", [*encode(tokenizer, answer), EOS[0]]) is None
    finally:
        grammars.discard("r")
    grammars.add("r", spec(json_schema=WEATHER["parameters"], thinking=True))
    rows = Rows(grammars)
    rows.add("r")
    try:
        assert rows.walk("r", encode(tokenizer, "<think>\nHmm.\n</think>\n\nSure")) is not None
    finally:
        grammars.discard("r")


def test_unconstrained_rows_of_the_same_batch_are_untouched(
    grammars: Grammars, tokenizer: Any
) -> None:
    grammars.add("c", spec(tools=TOOLS, tool_choice="get_time"))
    rows = Rows(grammars)
    rows.add("free")
    rows.add("c")
    try:
        scores = rows.step()
        assert bool(torch.isfinite(scores[0]).all())  # the free row: nothing masked
        assert int(torch.isfinite(scores[1]).sum()) < 10  # the constrained row: a few tokens
        assert bool(torch.isfinite(scores).any(dim=-1).all())  # no row left without a token
    finally:
        grammars.discard("c")


def test_compiled_grammars_are_cached_per_spec(grammars: Grammars) -> None:
    one = spec(tools=TOOLS, tool_choice="required")
    assert grammars.compile(one) is grammars.compile(spec(tools=TOOLS, tool_choice="required"))


def test_a_spec_crosses_a_process_boundary() -> None:
    import msgspec

    made = spec(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(made), type=GrammarSpec) == made
    assert made.single_call


@pytest.fixture(scope="module")
def manager_and_grammars(tiny_model_dir: Path, tokenizer: Any) -> Iterator[tuple[Any, Grammars]]:
    """A real continuous-batching manager on the tiny random model, grammars attached before
    it starts (what ``HfEngine`` does)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from services.hf_worker.model import load_model

    loaded = load_model(tiny_model_dir, random_weights=True, device="cpu", dtype="auto", seed=5)
    grammars = Grammars(tokenizer, vocab_size=loaded.vocab_size, stop_token_ids=EOS)
    generation = transformers.GenerationConfig(
        do_sample=True, max_new_tokens=16, eos_token_id=-1, temperature=0.5, top_k=50, top_p=0.5
    )
    with torch.inference_mode():
        manager = loaded.model.init_continuous_batching(
            generation_config=generation,
            continuous_batching_config=ContinuousBatchingConfig(
                num_blocks=64, max_batch_tokens=256, block_size=16, per_request_processors=True
            ),
        )
        grammars.attach(manager)
        manager.start()
    try:
        yield manager, grammars
    finally:
        manager.stop(block=True, timeout=10.0)


def generate(manager: Any, request_id: str, max_new_tokens: int) -> list[int]:
    manager.add_request(
        [9707, 11, 1879],
        request_id=request_id,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(EOS),
        temperature=1.0,
        top_k=VOCAB,
        top_p=1.0,
    )
    result = manager.get_result(request_id=request_id, timeout=120)
    assert result is not None
    return list(result.generated_tokens)


def test_a_real_manager_writes_one_valid_call(
    manager_and_grammars: tuple[Any, Grammars], tokenizer: Any
) -> None:
    manager, grammars = manager_and_grammars
    guided = Guided(
        tools=TOOLS, tool_choice="required", tool_syntax="hermes", parallel_tool_calls=False
    )
    made = grammar_spec(guided)
    assert made is not None
    grammars.add("m1", made)
    try:
        ids = generate(manager, "m1", 300)
    finally:
        grammars.discard("m1")
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert text.startswith("<tool_call>"), text
    body = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>").strip())
    assert body["name"] in {"get_weather", "get_time"}
    assert text.count("<tool_call>") == 1
    assert ids[-1] in EOS


def test_a_real_manager_keeps_to_the_thinking_budget(
    manager_and_grammars: tuple[Any, Grammars], tokenizer: Any
) -> None:
    manager, grammars = manager_and_grammars
    budget = 8
    grammars.add(
        "m2", spec(tools=TOOLS, tool_choice="get_time", thinking=True, max_thinking_tokens=budget)
    )
    try:
        ids = generate(manager, "m2", 300)
    finally:
        grammars.discard("m2")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<think>")
    closed = ids.index(THINK_CLOSE)
    assert closed - 1 <= budget  # tokens inside the block
    answer = tokenizer.decode(ids[closed + 1 :], skip_special_tokens=True).strip()
    assert answer.startswith('<tool_call>\n{"name": "get_time"'), answer


def test_attaching_to_a_started_manager_is_refused(
    manager_and_grammars: tuple[Any, Grammars], grammars: Grammars
) -> None:
    manager, _ = manager_and_grammars
    with pytest.raises(RuntimeError, match="before the manager starts"):
        grammars.attach(manager)


def test_a_worker_refuses_an_invalid_schema_without_a_tokenizer() -> None:
    from services.hf_worker.grammar import check_spec

    check_spec(spec(json_object=True))
    with pytest.raises(EngineError, match="cannot be compiled"):
        check_spec(spec(json_schema={"type": "object", "properties": {"a": {"$ref": "#/no"}}}))


def test_from_model_dir_stops_on_the_tokenizers_eos(tiny_model_dir: Path) -> None:
    made = Grammars.from_model_dir(tiny_model_dir, vocab_size=VOCAB)
    grammar = made.compile(spec(json_object=True))
    assert set(EOS) <= set(grammar.tokenizer_info.stop_token_ids)


def test_a_zero_budget_closes_the_block_at_once(grammars: Grammars, tokenizer: Any) -> None:
    grammars.add(
        "z", spec(tools=TOOLS, tool_choice="get_time", thinking=True, max_thinking_tokens=0)
    )
    rows = Rows(grammars)
    rows.add("z")
    try:
        think = encode(tokenizer, "<think>")
        assert rows.walk("z", think) is None
        scores = rows.step()
        assert rows.allowed(scores, 0, THINK_CLOSE)
        assert not rows.allowed(scores, 0, encode(tokenizer, "Hmm")[0])
    finally:
        grammars.discard("z")
