"""vLLM's per-request output deltas → JetServe ``Emission``s. Pure: no vllm import, no I/O.

Both engines feed a ``DeltaTracker`` with ``ChoiceDelta``s: the in-process one from each
``RequestOutput`` of ``AsyncLLM.generate`` with ``RequestOutputKind.DELTA`` (``vllm/outputs.py``
``RequestOutput`` / ``CompletionOutput``, read at commit
003d3ee22261b7937258b7531aee00e10393f1d6), the remote one from each streamed
``/v1/completions`` chunk with ``return_token_ids`` (``CompletionResponseStreamChoice``:
``index``, ``token_ids``, ``finish_reason``, ``stop_reason``, ``logprobs``).

The tracker numbers each choice's tokens (``Emission.index``, after any migrated tokens), puts
the prompt and cached token counts on the first emission, maps vLLM's finish reasons
(``stop``, ``length``, ``abort``, ``error``) to JetServe's, names the stop token (vLLM's
``stop_reason`` when it is a token id, else the last id of a ``stop`` finish: EOS is in the
output ids) and marks the request's last emission ``done``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.messages import FinishReason, TokenLogprob
from shared.worker.records import Emission

__all__ = [
    "ChoiceDelta",
    "DeltaTracker",
    "finish_reason",
    "logprobs_from_engine",
    "logprobs_from_http",
]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "cancelled",
    "error": "error",
}
TOKEN_ID_PREFIX = "token_id:"


def finish_reason(reason: str | None) -> FinishReason | None:
    """JetServe's finish reason for vLLM's (an unknown one counts as an error)."""
    if reason is None:
        return None
    return _FINISH.get(reason, "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceDelta:
    """What one choice produced since the last output."""

    choice: int
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    """vLLM's reason (``stop``, ``length``, ``abort``, ``error``)."""
    stop_reason: int | str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


def logprobs_from_engine(
    token_ids: Sequence[int], steps: Sequence[Mapping[int, Any] | None] | None, top: int
) -> tuple[TokenLogprob, ...]:
    """``CompletionOutput.logprobs`` (one ``{token_id: Logprob}`` per sampled token, each
    ``Logprob`` with ``logprob`` and ``rank``) → ``TokenLogprob``s with ``top`` alternatives,
    most likely first."""
    if not steps:
        return ()
    out = []
    for token, step in zip(token_ids, steps, strict=False):
        if step is None:
            out.append(TokenLogprob(logprob=float("nan")))
            continue
        sampled = step.get(token)
        ranked = sorted(
            step.items(),
            key=lambda item: (getattr(item[1], "rank", None) or 1 << 30, -item[1].logprob),
        )
        alternatives = tuple((int(t), float(lp.logprob)) for t, lp in ranked[:top])
        value = float(sampled.logprob) if sampled is not None else float("nan")
        out.append(TokenLogprob(logprob=value, top=alternatives))
    return tuple(out)


def _token_id(name: str) -> int | None:
    if name.startswith(TOKEN_ID_PREFIX):
        try:
            return int(name[len(TOKEN_ID_PREFIX) :])
        except ValueError:
            return None
    return None


def logprobs_from_http(body: Mapping[str, Any] | None, top: int) -> tuple[TokenLogprob, ...]:
    """A completions chunk's ``logprobs`` (``token_logprobs`` and ``top_logprobs`` keyed
    ``token_id:<id>``, as ``return_tokens_as_token_ids`` names them) → ``TokenLogprob``s."""
    if not body:
        return ()
    values: list[Any] = list(body.get("token_logprobs") or ())
    tops: list[Any] = list(body.get("top_logprobs") or ())
    out = []
    for i, value in enumerate(values):
        alternatives: list[tuple[int, float]] = []
        step = tops[i] if i < len(tops) else None
        if isinstance(step, Mapping):
            for name, lp in step.items():
                tid = _token_id(str(name))
                if tid is not None and lp is not None:
                    alternatives.append((tid, float(lp)))
        alternatives.sort(key=lambda a: -a[1])
        out.append(
            TokenLogprob(
                logprob=float(value) if value is not None else float("nan"),
                top=tuple(alternatives[:top]),
            )
        )
    return tuple(out)


@dataclass(slots=True)
class DeltaTracker:
    """One request's deltas → its emissions (see the module docstring)."""

    request_id: str
    n: int = 1
    prompt_tokens: int = 0
    resumed_tokens: int = 0
    emitted: dict[int, int] = field(default_factory=dict)
    """Tokens emitted per choice (migrated tokens not counted)."""
    finished: set[int] = field(default_factory=set)
    first: bool = True
    done: bool = False

    def emissions(
        self, deltas: Iterable[ChoiceDelta], *, finished: bool = False, cached_tokens: int = 0
    ) -> list[Emission]:
        """The emissions for one output. ``finished``: the engine says the whole request ended
        (the in-process ``RequestOutput.finished``); the request also ends once each of its
        ``n`` choices has a finish reason."""
        out: list[Emission] = []
        if self.done:
            return out
        for delta in deltas:
            reason = finish_reason(delta.finish_reason)
            if not delta.token_ids and reason is None:
                continue
            if delta.choice in self.finished:
                continue
            start = self.emitted.get(delta.choice, 0)
            self.emitted[delta.choice] = start + len(delta.token_ids)
            stop_id: int | None = None
            if reason == "stop":
                self.finished.add(delta.choice)
                if isinstance(delta.stop_reason, int):
                    stop_id = delta.stop_reason
                elif delta.stop_reason is None and delta.token_ids:
                    stop_id = delta.token_ids[-1]
            elif reason is not None:
                self.finished.add(delta.choice)
            out.append(
                Emission(
                    request_id=self.request_id,
                    token_ids=delta.token_ids,
                    index=self.resumed_tokens + start,
                    finish_reason=reason,
                    stop_token_id=stop_id,
                    prompt_tokens=self.prompt_tokens if self.first else 0,
                    cached_tokens=cached_tokens if self.first else 0,
                    choice=delta.choice,
                    logprobs=delta.logprobs,
                )
            )
            self.first = False
        if finished or len(self.finished) >= self.n:
            self.done = True
            if out:
                last = out[-1]
                out[-1] = Emission(
                    request_id=last.request_id,
                    token_ids=last.token_ids,
                    index=last.index,
                    finish_reason=last.finish_reason or self._fallback_reason(),
                    stop_token_id=last.stop_token_id,
                    prompt_tokens=last.prompt_tokens,
                    cached_tokens=last.cached_tokens,
                    choice=last.choice,
                    logprobs=last.logprobs,
                    done=True,
                )
            else:
                out.append(
                    Emission(
                        request_id=self.request_id,
                        token_ids=(),
                        index=self.resumed_tokens + self.emitted.get(0, 0),
                        finish_reason=self._fallback_reason(),
                        prompt_tokens=self.prompt_tokens if self.first else 0,
                        done=True,
                    )
                )
        return out

    def _fallback_reason(self) -> FinishReason:
        """A request that ended without its last choice saying why (cannot happen with a
        well-behaved engine) ended in error."""
        return "error"
