"""One request's formatting state: token batches in, response bytes out. Pure: ``now`` is passed.

Per choice (``output.n`` of them, ``TokenBatch.choice``; ``choice.Choice``): a detokenizer (stop
strings), then the reasoning parser (``output.reasoning_parser``) and the tool parser
(``output.tool_parser``), whose pieces go to the shaper of ``output.format`` (``shapers``).
Streaming requests yield the shaper's frames per batch (``opening`` with the first batch,
nothing for a batch that adds no piece); non-streaming ones yield one body once every choice
has finished. The request is finished when every choice is; its ``finish_reason`` is the first
choice's.

Loss detection and migration (decisions 017, 018) count positions per choice; only a request
with ``n == 1`` migrates (``StreamOpen.generate`` is ``None`` otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from msgspec import UNSET, UnsetType

from services.formatter.choice import PARSED_FORMATS, Choice, choices_for
from services.formatter.detokenizer import token_texts
from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Content,
    Piece,
    TokenLogprobs,
    collect,
)
from services.formatter.replay import ChunkHistory
from services.formatter.shapers import shaper_for
from services.formatter.shaping import Nvext, Shaper, Usage, usage
from shared import sse
from shared.api_objects import WorkerPair
from shared.errors import InternalError, ServiceError, ServiceUnavailable
from shared.messages import RouteChoice, StreamOpen, TokenBatch

_SSE_FORMATS = PARSED_FORMATS
"""Formats whose streams are SSE (``text`` and ``kserve`` are gRPC's)."""


class RequestFormatter:
    """Formats one request. ``on_batch`` returns the bytes to send (``b""`` = nothing yet)."""

    __slots__ = (
        "_choices",
        "_continuous",
        "_echo_worker",
        "_is_stream",
        "_open_choices",
        "_preamble",
        "_shaper",
        "_started",
        "_text_delta",
        "_texts",
        "_timing",
        "_top",
        "cached_tokens",
        "finish_reason",
        "first_token_at",
        "gateway_away_since",
        "generated",
        "history",
        "index_base",
        "is_pinging",
        "last_seen",
        "last_token_at",
        "lost_workers",
        "migrations",
        "open",
        "pinged_at",
        "placement",
        "query",
        "route_checked",
        "started_at",
        "token_batches",
        "worker_id",
    )

    def __init__(self, open_: StreamOpen, tokenizer: Any, *, now: float) -> None:
        self.open = open_
        out = open_.output
        self._shaper: Shaper = shaper_for(open_)
        self._is_stream = out.stream
        sse_stream = out.stream and out.format in _SSE_FORMATS
        self._preamble = (
            b"".join(sse.annotation(name, payload) for name, payload in open_.annotations)
            if sse_stream
            else b""
        )
        """``nvext.annotations`` frames, sent before the first chunk of an SSE stream."""
        self._texts = token_texts(tokenizer) if out.logprobs is not None else None
        """Token ids → text, only when log-probabilities are asked for."""
        self._top = max(0, out.logprobs or 0)
        self._choices = choices_for(
            open_, tokenizer, keep_logprobs=self._texts is not None and not out.stream
        )
        self._open_choices = len(self._choices)
        self._started = False
        # Text output carries no usage per chunk: never compute it per batch.
        self._continuous = out.include_usage and out.continuous_usage and out.format == "openai"
        fast = out.stream and not self._continuous and self._texts is None
        self._text_delta: Callable[[int, str], bytes] | None = (
            getattr(self._shaper, "text_delta", None) if fast else None
        )
        """The shaper's ``TextDeltas`` fast path, when plain text needs no more than that."""
        self._echo_worker = "worker_id" in out.extra_fields
        self._timing = "timing" in out.extra_fields
        self.worker_id = ""
        """The worker that produced the tokens (``TokenBatch.worker_id``)."""
        self.placement: tuple[int, str, int] = (0, "", 0)
        """``(dp_rank, prefill_worker_id, prefill_dp_rank)`` of the batches (issue 24)."""
        self.query: RouteChoice | None = None
        """A query-only request's answer: the response names where it would go."""
        self.cached_tokens = 0
        self.generated: list[int] | None = [] if open_.generate is not None else None
        """Every token id so far, kept only when the request may migrate (decision 017)."""
        self.index_base = 0
        """Tokens generated before the current attempt (its worker counts from 0)."""
        self.migrations = 0
        self.route_checked = False
        """Whether a router was asked where this attempt went (decision 017)."""
        self.lost_workers: set[str] = set()
        """Workers this request was taken from: a later ``WorkerLost`` about them is old news
        (their late batches are told apart by ``TokenBatch.attempt``)."""
        self.finish_reason: str | None = None
        """Set once the request is finished (then the caller drops this state)."""
        self.history = ChunkHistory()
        """The chunks sent so far, numbered, for a gateway that asks again (decision 018)."""
        self.gateway_away_since: float | None = None
        """When a chunk first bounced (its gateway is away) since the last ``StreamResume``."""
        self.is_pinging = False
        """Whether a ``WorkerPing`` about this request is in flight."""
        self.pinged_at = -math.inf
        """When the last ``WorkerPing`` about this request was sent."""
        self.started_at = now
        self.last_seen = now
        self.first_token_at: float | None = None
        """When the first batch with tokens came (``nvext.timing.ttft_ms``; kept only when
        ``timing`` is asked for, as the two below)."""
        self.last_token_at = now
        self.token_batches = 0
        """Batches with tokens so far (``nvext.timing.itl_ms`` is the mean time between them)."""

    @property
    def next_index(self) -> int:
        """Index the next batch (of the first choice) should start at; a different one means a
        lost or repeated batch."""
        return self._choices[0].next_index

    def expected_index(self, batch: TokenBatch) -> int:
        """Where ``batch`` should start (``position``) to be the next one of its choice; a batch
        of an unknown choice is never out of turn (``on_batch`` drops it)."""
        if 0 <= batch.choice < len(self._choices):
            return self._choices[batch.choice].next_index
        return self.position(batch)

    @property
    def completion_tokens(self) -> int:
        return sum(c.detok.completion_tokens for c in self._choices)

    @property
    def stopped_by_string(self) -> bool:
        """True when a stop string ended a choice (the worker must be told to stop)."""
        return any(c.detok.stopped for c in self._choices)

    def on_batch(self, batch: TokenBatch, now: float) -> bytes:
        """Apply one batch; return the bytes to send now (``b""`` when there is nothing).

        Raises:
            ServiceError: a non-streaming request that the worker ended with ``error`` or
                ``cancelled``: there is no valid body for it.
        """
        self.last_seen = now
        index = batch.choice
        if not 0 <= index < len(self._choices):
            return b""  # not one of this request's choices
        choice = self._choices[index]
        ids = batch.token_ids
        choice.next_index = self.index_base + batch.index + len(ids)
        if batch.cached_tokens and not self.migrations:
            self.cached_tokens = batch.cached_tokens
        if self.generated is not None:
            self.generated.extend(ids)
        if batch.dp_rank or batch.prefill_worker_id:
            self.placement = (batch.dp_rank, batch.prefill_worker_id, batch.prefill_dp_rank)
        if batch.worker_id and batch.worker_id != self.worker_id:
            self.worker_id = batch.worker_id
            # It holds the current attempt: if it is lost now, the request must move again.
            self.lost_workers.discard(batch.worker_id)
        if self._timing and ids:
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
            self.token_batches += 1
        if choice.end is not None:
            return b""  # a stop string ended it; the worker goes on with the other choices
        detok = choice.detok
        consumed = detok.completion_tokens
        text = detok.push(ids, stop_token_id=batch.stop_token_id)
        finish = "stop" if detok.stopped else batch.finish_reason
        if finish is not None:
            text += detok.flush()
        if choice.plain and self._text_delta is not None:  # the per-token common case
            if finish is not None:
                self._end(choice, finish)
            return self._text_frames(index, choice, text)
        pieces: list[Piece]
        if choice.plain:
            pieces = [Content(text)] if text else []
        else:
            pieces = choice.parse(text, finish is not None)
        if finish is not None:
            self._end(choice, finish)  # after parsing: it says whether tools were called
        logprobs: Sequence[TokenLogprobs] = ()
        if self._texts is not None and batch.logprobs:
            logprobs = self._logprobs(batch, detok.completion_tokens - consumed)
        if self._is_stream:
            return self._frames(index, choice, pieces, logprobs)
        return self._collect(choice, pieces, logprobs)

    def _end(self, choice: Choice, finish: str) -> None:
        choice.end = ChoiceEnd(finish, choice.has_tool_calls, choice.detok.stop_string)
        self._open_choices -= 1

    def _logprobs(self, batch: TokenBatch, consumed: int) -> list[TokenLogprobs]:
        """The log-probabilities of the ids the detokenizer consumed, as text (not the hidden
        EOS / stop token's)."""
        assert self._texts is not None
        ids = batch.token_ids[:consumed]
        if (
            batch.stop_token_id is not None
            and consumed == len(batch.token_ids)
            and not self.open.output.include_stop_str_in_output
        ):
            ids = ids[:-1]
        return self._texts.logprobs(ids, batch.logprobs[: len(ids)], self._top)

    def position(self, batch: TokenBatch) -> int:
        """Where ``batch`` starts in its choice's whole generated sequence."""
        return self.index_base + batch.index

    def awaits_routing_check(self, now: float, after_s: float) -> bool:
        """True once: a migratable attempt with no token after ``after_s`` (was it routed?)."""
        if (
            self.route_checked
            or self.open.generate is None
            or self.next_index != self.index_base
            or now - self.last_seen < after_s
        ):
            return False
        self.route_checked = True
        return True

    @property
    def may_migrate(self) -> bool:
        """Whether the request may be routed again once more (decision 017's limit)."""
        return self.open.generate is not None and self.migrations < self.open.migration_limit

    def awaits_stall_check(self, now: float, after_s: float) -> bool:
        """True when the worker should be asked whether it still holds this attempt: no batch
        and no ask for ``after_s`` (decision 018); starts the ask (``ping_started``)."""
        if now - self.last_seen < after_s or now - self.pinged_at < after_s:
            return False
        return self.ping_started(now)

    def ping_started(self, now: float) -> bool:
        """Start an ask now, unless one is in flight, the worker is unknown, or the request could
        not move anyway (then asking is useless: the idle timeout handles it)."""
        if self.is_pinging or not self.worker_id or not self.may_migrate:
            return False
        self.is_pinging = True
        self.pinged_at = now
        return True

    def gateway_gone(self, now: float, grace_s: float) -> bool:
        """True once its gateway has been away ``grace_s`` with no ``StreamResume`` since."""
        since = self.gateway_away_since
        return since is not None and now - since > grace_s

    def migrated(self, from_worker: str, now: float) -> None:
        """The request was routed again: the next worker counts its batches from 0."""
        self.migrations += 1
        if from_worker:
            self.lost_workers.add(from_worker)
        self.index_base = self.next_index
        self.worker_id = ""
        self.route_checked = False
        self.last_seen = now

    def _frames(
        self,
        index: int,
        choice: Choice,
        pieces: list[Piece],
        logprobs: Sequence[TokenLogprobs],
    ) -> bytes:
        shaper = self._shaper
        running = self._usage() if self._continuous else None
        if not self._started:
            self._started = True
            data = self._preamble + shaper.opening(running)
        else:
            data = b""
        if pieces or logprobs:
            data += shaper.delta(index, pieces, logprobs, running)
        end = choice.end
        if end is not None:
            data += shaper.choice_end(index, end, running)
            if not self._open_choices:
                self._finished()
                data += shaper.closing(self._usage(), self._nvext())
        return data

    def _text_frames(self, index: int, choice: Choice, text: str) -> bytes:
        """``_frames`` for plain text through the shaper's ``text_delta`` (no pieces built)."""
        shaper = self._shaper
        if not self._started:
            self._started = True
            data = self._preamble + shaper.opening()
        else:
            data = b""
        if text:
            assert self._text_delta is not None
            data += self._text_delta(index, text)
        end = choice.end
        if end is not None:
            data += shaper.choice_end(index, end)
            if not self._open_choices:
                self._finished()
                data += shaper.closing(self._usage(), self._nvext())
        return data

    def _collect(
        self, choice: Choice, pieces: list[Piece], logprobs: Sequence[TokenLogprobs]
    ) -> bytes:
        self._started = True
        choice.pieces += pieces
        if choice.logprobs is not None:
            choice.logprobs += logprobs
        end = choice.end
        if end is None:
            return b""
        failure = _failure(end.finish_reason)
        if failure is not None:
            self.finish_reason = end.finish_reason
            raise failure
        if self._open_choices:
            return b""
        self._finished()
        results = [
            ChoiceResult(n, collect(c.pieces), c.end, c.logprobs)
            for n, c in enumerate(self._choices)
            if c.end is not None
        ]
        return self._shaper.body(results, self._usage(), self._nvext())

    def _finished(self) -> None:
        first = self._choices[0].end
        self.finish_reason = first.finish_reason if first is not None else "stop"

    def answer_query(self, choice: RouteChoice) -> tuple[TokenBatch, ...]:
        """A query-only request's answer, as the batches that end it, one per choice (``n``):
        no token, the prompt counted; the response's ``nvext`` names the workers and the token
        ids."""
        self.query = choice
        return tuple(
            TokenBatch(
                request_id=choice.request_id,
                token_ids=(),
                index=c.next_index - self.index_base,
                finish_reason="stop",
                prompt_tokens=choice.prompt_tokens,
                worker_id=choice.worker_id,
                attempt=self.migrations,
                choice=n,
            )
            for n, c in enumerate(self._choices)
        )

    def _nvext(self) -> Nvext | None:
        """The response's ``nvext`` when ``nvext.extra_fields`` asked for something, or for a
        query-only answer."""
        query = self.query
        if query is not None:
            pair = WorkerPair(
                prefill_worker_id=query.prefill_worker_id or None,
                prefill_dp_rank=query.prefill_dp_rank if query.prefill_worker_id else None,
                decode_worker_id=query.worker_id,
                decode_dp_rank=query.dp_rank,
            )
            return Nvext(worker_id=pair, token_ids=query.token_ids)
        if not (self._echo_worker or self._timing):
            return None
        worker: str | WorkerPair | UnsetType = UNSET
        dp_rank: int | UnsetType = UNSET
        if self._echo_worker:
            rank, prefill, prefill_rank = self.placement
            if prefill:
                worker = WorkerPair(
                    prefill_worker_id=prefill,
                    prefill_dp_rank=prefill_rank,
                    decode_worker_id=self.worker_id,
                    decode_dp_rank=rank,
                )
            else:
                worker = self.worker_id
                dp_rank = rank or UNSET
        return Nvext(
            worker_id=worker,
            dp_rank=dp_rank,
            timing=self.timing() if self._timing else UNSET,
        )

    def timing(self) -> dict[str, float]:
        """``ttft_ms``: from the open to the first token; ``itl_ms``: the mean time between
        batches with tokens after it (0 with one batch)."""
        first = self.first_token_at
        if first is None:
            return {"ttft_ms": 0.0, "itl_ms": 0.0}
        gaps = self.token_batches - 1
        itl_s = (self.last_token_at - first) / gaps if gaps > 0 else 0.0
        return {
            "ttft_ms": round((first - self.started_at) * 1000, 3),
            "itl_ms": round(itl_s * 1000, 3),
        }

    def _usage(self) -> Usage:
        return usage(self.open.prompt_tokens, self.completion_tokens, self.cached_tokens)


def _failure(finish_reason: str) -> ServiceError | None:
    """What a non-streaming request that ended so raises: no valid body exists for it."""
    if finish_reason == "error":
        return InternalError("the worker failed while generating")
    if finish_reason == "cancelled":
        return ServiceUnavailable("the worker cancelled the request")
    return None
