"""Session affinity (``--session-affinity-ttl-s``): which worker a session's next turn goes to.

Pure: no I/O, no clock. A session (``RoutingHints.session_id``) is bound to one routing target
(a worker and its data-parallel rank). ``plan`` says what to do with a turn given the binding
and the bound worker's state; ``settle`` says what to write once the turn is routed:

* no binding (first turn, or the binding expired): route normally, then create the binding;
* ``hard``: the bound worker while it lives (busy or not: the binding is an exact constraint);
  dead, the turn is routed anew and the binding moves to the new choice;
* ``soft``: the bound worker while it lives and is under the busy thresholds; busy or dead, the
  turn is routed anew (the binding is a preference) and moves if the choice differs.

A binding moves only then. A binding used again is refreshed (its TTL starts over) at most once
per ``refresh_after_s``, so a busy session does not write on every turn. ``SessionTable`` is the
in-memory map every replica keeps from the bucket's watch (``session_store.py``), so routing
never waits on a KV round trip; it expires bindings by their age, as the bucket does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from shared.sessions import session_key
from shared.targets import target_id

__all__ = [
    "AFFINITY_MODES",
    "Binding",
    "Plan",
    "SessionTable",
    "StoredBinding",
    "plan",
    "refresh_after_s",
    "session_key",
    "settle",
]

AffinityMode = Literal["hard", "soft"]
AFFINITY_MODES: tuple[AffinityMode, ...] = ("hard", "soft")
Verdict = Literal["new", "hit", "dead", "busy"]
"""What a turn found: no binding, its bound worker usable, or dead / busy (moved if needed)."""
Write = Literal["create", "move", "refresh", "none"]

REFRESH_FRACTION = 0.25
"""A used binding is written again once it is this fraction of the TTL old."""


class StoredBinding(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A binding as the session bucket stores it (key: ``session_key``)."""

    worker_id: str
    dp_rank: int = 0
    router_id: str = ""
    """The replica that wrote it last (for debugging)."""


@dataclass(frozen=True, slots=True)
class Binding:
    """A session's bound target as this replica knows it."""

    worker_id: str
    dp_rank: int
    revision: int
    """The bucket's revision of the value (compare-and-set writes name it)."""
    updated_at: float
    """When the value was written (wall clock): its TTL counts from here."""

    @property
    def target(self) -> str:
        return target_id(self.worker_id, self.dp_rank)


@dataclass(frozen=True, slots=True)
class Plan:
    """How to route one turn: ``target`` constrains the decision to the bound target."""

    verdict: Verdict
    target: str | None = None


def plan(binding: Binding | None, mode: AffinityMode, *, is_live: bool, is_busy: bool) -> Plan:
    """Where a turn of a session with ``binding`` may go (``is_live`` / ``is_busy``: the bound
    target's state as this replica sees it)."""
    if binding is None:
        return Plan("new")
    if not is_live:
        return Plan("dead")
    if mode == "soft" and is_busy:
        return Plan("busy")
    return Plan("hit", binding.target)


def settle(
    turn: Plan, binding: Binding | None, chosen: str, now: float, refresh_after_s: float
) -> Write:
    """What to write once the turn went to target ``chosen``: create a first binding, move one
    whose worker was dead or busy (if the choice differs), refresh one used again when due."""
    if binding is None:
        return "create"
    if chosen != binding.target:
        return "move"
    return "refresh" if now - binding.updated_at >= refresh_after_s else "none"


def refresh_after_s(ttl_s: float) -> float:
    """How old a used binding must be before it is written again."""
    return ttl_s * REFRESH_FRACTION


class SessionTable:
    """Bindings by session key, as the bucket's watch delivers them; a binding older than
    ``ttl_s`` is gone (the bucket drops it by max age, and a watch hears nothing of that)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._bindings: dict[str, Binding] = {}

    def __len__(self) -> int:
        return len(self._bindings)

    def get(self, key: str, now: float) -> Binding | None:
        """The live binding of ``key``, or None (an expired one is dropped)."""
        binding = self._bindings.get(key)
        if binding is not None and now - binding.updated_at >= self.ttl_s:
            del self._bindings[key]
            return None
        return binding

    def put(self, key: str, binding: Binding) -> bool:
        """Keep ``binding`` unless a newer revision is known; True if kept."""
        known = self._bindings.get(key)
        if known is not None and known.revision > binding.revision:
            return False
        self._bindings[key] = binding
        return True

    def remove(self, key: str, revision: int | None = None) -> None:
        """Forget ``key`` (a delete or purge seen at ``revision``: a newer value stays)."""
        known = self._bindings.get(key)
        if known is not None and (revision is None or known.revision <= revision):
            del self._bindings[key]

    def expire(self, now: float) -> int:
        """Drop every binding older than the TTL; how many."""
        old = [k for k, b in self._bindings.items() if now - b.updated_at >= self.ttl_s]
        for key in old:
            del self._bindings[key]
        return len(old)
