"""JetServe ``SamplingParams`` → one continuous-batching request's arguments. Pure: no torch.

transformers' continuous batching (``ContinuousBatchingManager.add_request``) takes, per request,
``max_new_tokens``, ``eos_token_id`` and, with ``per_request_processors``, the keyword arguments
of its per-request logits processors: ``temperature``, ``top_k`` and ``top_p`` (read in
``transformers/generation/continuous_batching/cb_logits_processors.py``, 5.17 to 5.24). Sampling
itself (``do_sample``) is one switch for the whole batch, so the manager always samples and a
greedy request is ``top_k=1`` (the most likely token; exact ties are broken at random).

Every request passes all three processor arguments, so the manager's defaults
(``PROCESSOR_DEFAULTS``, which only make the processors exist) never apply.

Guided decoding (``response_format``, ``tool_choice`` required or named, ``parallel_tool_calls:
false``, ``max_thinking_tokens``) becomes ``CbRequest.grammar`` (``grammar.grammar_spec``), which
the engine hands its ``Grammars`` before ``add_request`` (decision 028).

What this engine cannot honour per request raises ``EngineError`` (a 400) with the reason:
``n`` > 1, log-probabilities, penalties, ``min_p``, ``logit_bias``, ``min_tokens``, and a forced
tool call in a syntax without a grammar (``mistral``). ``seed`` is accepted and ignored: the
manager has one random generator (seeded from ``--seed``), so a seeded request is a valid sample,
not a reproducible one.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.hf_worker.grammar import GrammarSpec, grammar_spec
from shared.messages import SamplingParams
from shared.worker.records import EngineError

__all__ = ["PROCESSOR_DEFAULTS", "CbRequest", "cb_request", "unsupported"]

PROCESSOR_DEFAULTS: dict[str, float | int] = {"temperature": 0.5, "top_k": 50, "top_p": 0.5}
"""Generation-config values that make transformers build the temperature, top-k and top-p
processors (a temperature of 1.0 or a top-p of 1.0 builds none); every request overrides them."""


@dataclass(frozen=True, slots=True)
class CbRequest:
    """``add_request`` arguments besides the prompt and the request id."""

    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    """Ids that end the request (empty: none, e.g. ``ignore_eos`` without stop ids)."""
    temperature: float
    top_k: int
    top_p: float
    grammar: GrammarSpec | None = None
    """What the output must look like (``None``: unconstrained): ``Grammars.add`` it."""

    def processor_kwargs(self) -> dict[str, float | int]:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


def unsupported(sampling: SamplingParams) -> list[str]:
    """What of ``sampling`` this engine cannot do (empty: everything is fine)."""
    problems = []
    if sampling.n != 1:
        problems.append("n > 1")
    if sampling.logprobs is not None:
        problems.append("logprobs")
    if sampling.presence_penalty or sampling.frequency_penalty:
        problems.append("presence/frequency penalties")
    if sampling.repetition_penalty != 1.0:
        problems.append("repetition_penalty")
    if sampling.min_p:
        problems.append("min_p")
    if sampling.logit_bias:
        problems.append("logit_bias")
    if sampling.min_tokens:
        problems.append("min_tokens")
    return problems


def cb_request(sampling: SamplingParams, vocab_size: int) -> CbRequest:
    """The manager's arguments for ``sampling``; ``EngineError`` for what it cannot do."""
    problems = unsupported(sampling)
    if problems:
        raise EngineError(f"unsupported by the hf engine: {', '.join(problems)}")
    if sampling.max_tokens < 1:
        raise EngineError("max_tokens must be at least 1")
    grammar = grammar_spec(sampling.guided)
    greedy = sampling.greedy or sampling.temperature <= 0.0 or sampling.top_k == 1
    if greedy:
        return CbRequest(
            max_new_tokens=sampling.max_tokens,
            eos_token_ids=sampling.stop_token_ids,
            temperature=1.0,
            top_k=1,
            top_p=1.0,
            grammar=grammar,
        )
    top_k = sampling.top_k if sampling.top_k > 0 else vocab_size
    top_p = sampling.top_p if 0.0 < sampling.top_p <= 1.0 else 1.0
    return CbRequest(
        max_new_tokens=sampling.max_tokens,
        eos_token_ids=sampling.stop_token_ids,
        temperature=float(sampling.temperature),
        top_k=min(top_k, vocab_size),
        top_p=float(top_p),
        grammar=grammar,
    )
