"""One request's formatting state: token batches in, response bytes out. Pure: ``now`` is passed.

Streaming requests yield SSE frames per batch (nothing for a batch that adds no visible text,
except the first); non-streaming ones yield one JSON body when the request finishes. With
``output.format == "text"`` the same happens with bare UTF-8 text instead (no frame for an
empty first batch; the finish adds no bytes).
"""

from __future__ import annotations

import math
from typing import Any

from services.formatter.chunks import Nvext, Shaper, Usage, shaper_for, usage
from services.formatter.detokenizer import Detokenizer
from services.formatter.replay import ChunkHistory
from shared.errors import InternalError, ServiceUnavailable
from shared.messages import StreamOpen, TokenBatch


class RequestFormatter:
    """Formats one request. ``on_batch`` returns the bytes to send (``b""`` = nothing yet)."""

    __slots__ = (
        "_continuous",
        "_detok",
        "_echo_worker",
        "_is_stream",
        "_parts",
        "_shaper",
        "_started",
        "cached_tokens",
        "finish_reason",
        "gateway_away_since",
        "generated",
        "history",
        "index_base",
        "is_pinging",
        "last_seen",
        "lost_workers",
        "migrations",
        "next_index",
        "open",
        "pinged_at",
        "route_checked",
        "started_at",
        "worker_id",
    )

    def __init__(self, open_: StreamOpen, tokenizer: Any, *, now: float) -> None:
        self.open = open_
        out = open_.output
        self._detok = Detokenizer(
            tokenizer,
            stop=out.stop,
            include_stop_str_in_output=out.include_stop_str_in_output,
            skip_special_tokens=out.skip_special_tokens,
        )
        self._shaper: Shaper = shaper_for(open_)
        self._is_stream = out.stream
        self._parts: list[str] = []
        """Non-streaming: the text so far."""
        self._started = False
        # Text output carries no usage per chunk: never compute it per batch.
        self._continuous = out.include_usage and out.continuous_usage and out.format == "openai"
        self._echo_worker = "worker_id" in out.extra_fields
        self.worker_id = ""
        """The worker that produced the tokens (``TokenBatch.worker_id``)."""
        self.cached_tokens = 0
        self.next_index = 0
        """Index the next batch should start at; a different one means a lost or repeated batch."""
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

    @property
    def completion_tokens(self) -> int:
        return self._detok.completion_tokens

    @property
    def stopped_by_string(self) -> bool:
        """True when a stop string ended the request (the worker must be told to stop)."""
        return self._detok.stopped

    def on_batch(self, batch: TokenBatch, now: float) -> bytes:
        """Apply one batch; return the bytes to send now (``b""`` when there is nothing).

        Raises:
            ServiceError: a non-streaming request that the worker ended with ``error`` or
                ``cancelled``: there is no valid OpenAI body for it.
        """
        self.last_seen = now
        self.next_index = self.index_base + batch.index + len(batch.token_ids)
        if batch.cached_tokens and not self.migrations:
            self.cached_tokens = batch.cached_tokens
        if self.generated is not None:
            self.generated.extend(batch.token_ids)
        if batch.worker_id and batch.worker_id != self.worker_id:
            self.worker_id = batch.worker_id
            # It holds the current attempt: if it is lost now, the request must move again.
            self.lost_workers.discard(batch.worker_id)
        detok = self._detok
        text = detok.push(batch.token_ids, stop_token_id=batch.stop_token_id)
        finish = "stop" if detok.stopped else batch.finish_reason
        if finish is not None:
            text += detok.flush()
            self.finish_reason = finish
        if self._is_stream:
            return self._frames(text, finish)
        return self._collect(text, finish)

    def position(self, batch: TokenBatch) -> int:
        """Where ``batch`` starts in the request's whole generated sequence."""
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

    def _frames(self, text: str, finish: str | None) -> bytes:
        shaper = self._shaper
        running = self._usage() if self._continuous else None
        if not self._started:
            self._started = True
            data = shaper.first(text, running)
        else:
            data = shaper.delta(text, running) if text else b""
        if finish is not None:
            data += shaper.end(finish, self._usage(), self._nvext())
        return data

    def _collect(self, text: str, finish: str | None) -> bytes:
        self._started = True
        if text:
            self._parts.append(text)
        if finish is None:
            return b""
        if finish == "error":
            raise InternalError("the worker failed while generating")
        if finish == "cancelled":
            raise ServiceUnavailable("the worker cancelled the request")
        return self._shaper.body("".join(self._parts), finish, self._usage(), self._nvext())

    def _nvext(self) -> Nvext | None:
        """The response's ``nvext`` when ``nvext.extra_fields`` asked for ``worker_id``."""
        return Nvext(worker_id=self.worker_id) if self._echo_worker else None

    def _usage(self) -> Usage:
        return usage(self.open.prompt_tokens, self._detok.completion_tokens, self.cached_tokens)
