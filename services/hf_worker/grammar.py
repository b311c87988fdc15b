"""Guided decoding for the transformers engine: what a request's output must look like
(``GrammarSpec``) and the per-request token masks that enforce it (``Grammars``), with xgrammar
(decision 028).

``grammar_spec`` is pure: ``Guided`` (plus the card's tool and reasoning syntax it carries) →
one structural tag (``shared.structural_tags``): an optional or forced reasoning block capped at
``max_thinking_tokens`` ("think first, then constrain": the cap makes ``</think>`` the only way
on), then the answer: forced tool calls in the model's own syntax (one only for a named function
or ``parallel_tool_calls: false``), ``response_format``'s JSON, or free text. A ``GrammarSpec``
is a msgspec Struct, so it can cross to an engine process.

``Grammars`` holds xgrammar's tokenizer info and compiler (a compiled grammar is cached per
spec) and one matcher per constrained request. ``attach(manager)`` adds its logits processor to
a transformers continuous-batching manager (``transformers/generation/continuous_batching/
cb_logits_processors.py`` ``ContinuousBatchingLogitsProcessor``, 5.17 to 5.24): before the manager
starts (the manager sizes its per-processor argument rows then), first in the list (a masked
token must never survive top-k as the only one), and with async batching off: the mask of step
t+1 depends on the token of step t, which async batching has not yet copied back when it prepares
t+1. ``prepare_tensor_args`` (host side, once per step, in the manager's thread) feeds each
constrained request's new tokens to its matcher and writes its row of the bitmask, then copies
the rows to the device. ``__call__`` masks the constrained rows with xgrammar's kernel, and does
nothing when no row is constrained; while a CUDA graph is being captured it masks with tensor ops
only (no branching on data: the flags of ``tensor_arg`` say which rows count), so the replayed
graph stays correct. Rows of unconstrained requests, and padding rows, carry flag 0.

xgrammar, torch and transformers are imported by ``Grammars`` only; the spec side imports none.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from shared.messages import Guided
from shared.structural_tags import (
    answer_format,
    dumps,
    forces_tool_calls,
    reasoning_format,
    structural_tag,
)
from shared.worker.records import EngineError

log = structlog.get_logger(__name__)

__all__ = ["MAX_WHITESPACE", "GrammarSpec", "Grammars", "check_spec", "grammar_spec"]

MAX_WHITESPACE = 16
"""Longest whitespace run inside constrained JSON: a small model can otherwise loop on
whitespace forever (vLLM leaves it unbounded)."""


class GrammarSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One request's grammar: an xgrammar structural tag as JSON text, and what it was made of
    (for logs and errors)."""

    structural_tag: str
    kind: str
    """``tool_calls``, ``json``, or ``reasoning`` (only the reasoning block is bounded)."""
    single_call: bool = False
    max_thinking_tokens: int | None = None


def grammar_spec(guided: Guided | None) -> GrammarSpec | None:
    """The grammar ``guided`` asks for (``None``: nothing to constrain). ``EngineError`` (a
    400) for a forced tool call in a syntax without a tag (``mistral``)."""
    if guided is None:
        return None
    try:
        answer = answer_format(guided)
    except ValueError as exc:  # NoToolTag
        raise EngineError(f"{exc} (hf engine)") from None
    reasoning = reasoning_format(guided)
    bounded = guided.max_thinking_tokens is not None and reasoning is not None
    if answer is None and not bounded:
        return None
    if answer is None:
        answer = {"type": "any_text"}
    tag = structural_tag([reasoning, _cap_whitespace(answer)])
    assert tag is not None
    calls = forces_tool_calls(guided)
    return GrammarSpec(
        structural_tag=dumps(tag),
        kind="tool_calls" if calls else ("json" if answer["type"] != "any_text" else "reasoning"),
        single_call=calls and (guided.tool_choice != "required" or not guided.parallel_tool_calls),
        max_thinking_tokens=guided.max_thinking_tokens if bounded else None,
    )


def check_spec(spec: GrammarSpec) -> None:
    """``EngineError`` (a 400) if xgrammar cannot read ``spec`` (an invalid JSON schema, say):
    no tokenizer needed, so a worker can refuse a request before its engine sees it."""
    xgr = importlib.import_module("xgrammar")
    try:
        xgr.Grammar.from_structural_tag(spec.structural_tag)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise EngineError(f"the output constraint cannot be compiled: {exc}") from exc


def _cap_whitespace(fmt: Any) -> Any:
    """``fmt`` with every JSON content's whitespace runs capped (``MAX_WHITESPACE``); schemas
    themselves are not walked."""
    if isinstance(fmt, list):
        return [_cap_whitespace(v) for v in fmt]
    if not isinstance(fmt, dict):
        return fmt
    if fmt.get("type") == "json_schema":
        return {"max_whitespace_cnt": MAX_WHITESPACE, **fmt}
    return {k: _cap_whitespace(v) for k, v in fmt.items()}


@dataclass(slots=True)
class _Active:
    """One constrained request: its matcher and how many of its tokens it has taken."""

    matcher: Any
    consumed: int = 0
    failed: bool = False


class Grammars:
    """Compiled grammars and the matchers of the constrained requests of one engine."""

    def __init__(
        self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int] = ()
    ) -> None:
        """``tokenizer``: the model's transformers tokenizer; ``vocab_size``: the width of its
        logits (Qwen3: 151,936, more than the tokenizer's entries); ``stop_token_ids``: the ids
        that may end a finished grammar (the model's EOS ids)."""
        self._xgr = importlib.import_module("xgrammar")
        self._torch = importlib.import_module("torch")
        info = self._xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None
        )
        self._compiler = self._xgr.GrammarCompiler(info, max_threads=1)
        self.vocab_size = vocab_size
        self._compiled: dict[str, Any] = {}
        self._active: dict[str, _Active] = {}
        self._lock = threading.Lock()
        self.processor: Any = None

    @classmethod
    def from_model_dir(
        cls, model_dir: Path, *, vocab_size: int, stop_token_ids: Sequence[int] = ()
    ) -> Grammars:
        """Load the tokenizer of a local model directory (no hub); ``stop_token_ids`` default
        to the tokenizer's EOS and ``<|endoftext|>`` where it has one."""
        transformers = importlib.import_module("transformers")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
        if not stop_token_ids:
            ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
            unknown = tokenizer.unk_token_id
            stop_token_ids = [i for i in ids if isinstance(i, int) and i != unknown]
        return cls(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)

    # --- requests -----------------------------------------------------------------------------

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar of ``spec`` (cached); ``EngineError`` if xgrammar refuses it
        (e.g. an invalid JSON schema)."""
        compiled = self._compiled.get(spec.structural_tag)
        if compiled is None:
            try:
                compiled = self._compiler.compile_structural_tag(spec.structural_tag)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise EngineError(f"the output constraint cannot be compiled: {exc}") from exc
            self._compiled[spec.structural_tag] = compiled
        return compiled

    def add(self, request_id: str, spec: GrammarSpec, resumed: Iterable[int] = ()) -> None:
        """Constrain ``request_id`` from its next token; ``resumed``: tokens it already
        generated before a migration (they are in its prompt now), fed to the matcher first."""
        matcher = self._xgr.GrammarMatcher(self.compile(spec))
        for token in resumed:
            if not matcher.accept_token(int(token)):
                raise EngineError("the resumed output does not match its constraint")
        with self._lock:
            self._active[request_id] = _Active(matcher)

    def discard(self, request_id: str) -> None:
        """Forget a request (finished, cancelled or failed); unknown ids are ignored."""
        with self._lock:
            self._active.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._active

    def __len__(self) -> int:
        return len(self._active)

    # --- one step (the manager's thread) ------------------------------------------------------

    def fill(self, rows: Sequence[tuple[str, Sequence[int]]], bitmask: Any) -> list[int]:
        """For each ``(request_id, generated tokens so far)`` row: feed the matcher the tokens
        it has not seen, then write the row's allowed next tokens into ``bitmask`` (int32,
        ``[rows, ceil(vocab / 32)]``). Returns one flag per row: 1 constrained, 0 not."""
        flags = []
        with self._lock:
            active = [self._active.get(rid) for rid, _ in rows]
        for i, ((rid, generated), state) in enumerate(zip(rows, active, strict=True)):
            if state is None or state.failed:
                flags.append(0)
                continue
            for token in generated[state.consumed :]:
                if not state.matcher.accept_token(int(token)):
                    state.failed = True  # only masked-out tokens are refused: a bug, not input
                    log.warning("grammar_token_refused", request_id=rid, token=int(token))
                    break
            state.consumed = len(generated)
            if state.failed or state.matcher.is_terminated():
                flags.append(0)
                continue
            state.matcher.fill_next_token_bitmask(bitmask, i)
            flags.append(1)
        return flags

    def attach(self, manager: Any) -> Any:
        """Add the grammar logits processor to a transformers ``ContinuousBatchingManager`` that
        has not started (see the module docstring); returns the processor."""
        if getattr(manager, "batch_processor", None) is not None:
            raise RuntimeError("attach the grammars before the manager starts")
        config = manager.continuous_batching_config
        if getattr(config, "use_async_batching", None):
            log.info("grammar_async_batching_off")
        config.use_async_batching = False
        processors = manager.logit_processor
        rows = int(getattr(config, "max_requests_per_batch", 0) or 0) or 256
        self.processor = _make_processor(self, rows, _device(manager))
        processors.logits_processor.insert(0, self.processor)
        processors.tensors_required += 1
        processors.do_processing = True
        return self.processor


def _device(manager: Any) -> Any:
    return getattr(manager.model, "device", "cpu")


def _make_processor(grammars: Grammars, rows: int, device: Any) -> Any:
    """A ``ContinuousBatchingLogitsProcessor`` subclass instance bound to ``grammars`` (built
    here: the base class is transformers')."""
    module = importlib.import_module(
        "transformers.generation.continuous_batching.cb_logits_processors"
    )
    base = module.ContinuousBatchingLogitsProcessor
    torch = grammars._torch
    xgr = grammars._xgr

    class GrammarLogitsProcessor(base):  # type: ignore[misc,valid-type]
        """Masks the rows of constrained requests with their grammar's allowed tokens."""

        supported_kwargs: dict[str, type] = {}  # noqa: RUF012 (transformers' class attribute)
        ignored_kwargs: tuple[str, ...] = ()

        def __init__(self) -> None:
            self.rows = rows
            self.host = xgr.allocate_token_bitmask(rows, grammars.vocab_size)
            self.device_mask = self.host.to(device)
            self.shifts = torch.arange(32, dtype=torch.int32, device=device)
            self.constrained: list[int] = []

        def fill_defaults(self, int32_tensor: Any) -> None:
            int32_tensor.fill_(0)

        def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> Any:
            rows_in = [
                (r.state.request_id, r.state.generated_tokens) for r in requests_with_new_token
            ]
            if len(rows_in) > self.rows:  # more rows than the manager said it batches
                self.rows = len(rows_in)
                self.host = xgr.allocate_token_bitmask(self.rows, grammars.vocab_size)
                self.device_mask = self.host.to(device)
            flags = grammars.fill(rows_in, self.host) if len(grammars) else [0] * len(rows_in)
            self.constrained = [i for i, flag in enumerate(flags) if flag]
            if self.constrained:
                self.device_mask[: len(rows_in)].copy_(self.host[: len(rows_in)])
            return torch.tensor(flags, dtype=torch.int32)

        def __call__(self, scores: Any, tensor_arg: Any) -> Any:
            n, vocab = scores.shape
            if vocab > self.device_mask.shape[1] * 32:
                raise RuntimeError(f"logits are {vocab} wide; the grammars' vocabulary is smaller")
            if not (scores.is_cuda and torch.cuda.is_current_stream_capturing()):
                # Eager: mask only the constrained rows (xgrammar's kernel), or nothing at all.
                if self.constrained:
                    xgr.apply_token_bitmask_inplace(
                        scores, self.device_mask[:n], indices=self.constrained
                    )
                return scores
            # Captured in a CUDA graph: tensor ops only, every row, flags say which count.
            words = self.device_mask[:n]
            bits = (words.unsqueeze(-1) >> self.shifts) & 1
            allowed = bits.view(n, -1)[:, :vocab].bool()
            free = (tensor_arg[:n] == 0).unsqueeze(-1)
            return scores.masked_fill(~(allowed | free), float("-inf"))

    return GrammarLogitsProcessor()
