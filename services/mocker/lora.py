"""Simulated LoRA slots: which adapters the mocker's engine has loaded, and which requests wait
for one to load. Pure: the clock comes in as ``now``.

As vLLM: an engine holds any number of adapters (``--lora-modules``, ``load_lora_adapter``) but
keeps at most ``max_loras`` loaded at once; a request for a held adapter that is not loaded waits
while it is loaded from its path (``load_time_s``), in the slot of the least recently used
adapter that no running request uses. One departure: vLLM v1's scheduler skips a waiting request
whose adapter would exceed ``max_loras`` and schedules later ones, so under steady traffic of
the loaded adapters it can wait without bound. Here, when no slot can be freed, the least
recently used loaded adapter is *draining*: its new requests wait too, so its slot frees once
its running ones finish; requests for the other loaded adapters go on meanwhile, and nobody
starves (decision 031).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")

__all__ = ["AdapterSlots"]


@dataclass(slots=True)
class _Waiting(Generic[P]):
    request_id: str
    lora: str
    payload: P


class AdapterSlots(Generic[P]):
    """``max_loras`` slots, LRU; requests (opaque ``payload``s) wait in arrival order."""

    def __init__(self, max_loras: int, load_time_s: float = 0.0) -> None:
        if max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        self.max_loras = max_loras
        self.load_time_s = load_time_s
        self.held: dict[str, str] = {}
        """Adapter name -> path: what this engine may serve."""
        self.loaded: OrderedDict[str, None] = OrderedDict()
        """In slots, least recently used first."""
        self.loading: dict[str, float] = {}
        """Adapter -> when its load ends (it has a slot already)."""
        self.loads = 0
        """Loads started so far (each costs ``load_time_s``)."""
        self._in_use: Counter[str] = Counter()
        self._of: dict[str, str] = {}
        """Request id -> adapter, for requests in the engine."""
        self._waiting: deque[_Waiting[P]] = deque()
        self._draining: set[str] = set()
        """Loaded adapters that take no new requests: their slot is wanted."""

    # --- adapters ------------------------------------------------------------------------------
    def hold(self, name: str, path: str, now: float) -> bool:
        """Hold ``name`` (True if it was not held); load it at once when a slot is free, as
        vLLM's ``add_lora`` pre-loads an adapter."""
        is_new = name not in self.held
        self.held[name] = path
        if name not in self.loaded and name not in self.loading and self._free_slots() > 0:
            self._start_load(name, now)
        return is_new

    def drop(self, name: str) -> list[P]:
        """Stop holding ``name``: its slot frees once no running request uses it; the requests
        still waiting for it are returned (their caller fails them)."""
        self.held.pop(name, None)
        if not self._in_use[name]:
            self.loaded.pop(name, None)
            self.loading.pop(name, None)
        dropped = [w for w in self._waiting if w.lora == name]
        self._waiting = deque(w for w in self._waiting if w.lora != name)
        return [w.payload for w in dropped]

    # --- requests ------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: str) -> bool:
        return any(w.request_id == request_id for w in self._waiting)

    def admit(self, request_id: str, lora: str | None, payload: P) -> bool:
        """True: ``payload`` may enter the engine now; False: it waits (``advance`` returns it
        when its adapter is loaded). A request without an adapter never waits."""
        if lora is None:
            return True
        waits = any(w.lora == lora for w in self._waiting)  # its own earlier requests first
        if lora not in self.loaded or lora in self._draining or waits:
            self._waiting.append(_Waiting(request_id, lora, payload))
            return False
        self._enter(request_id, lora)
        return True

    def done(self, request_id: str) -> None:
        """A request left the engine (finished or cancelled): its adapter's slot may be reused."""
        lora = self._of.pop(request_id, None)
        if lora is None:
            return
        self._in_use[lora] -= 1
        if self._in_use[lora] <= 0:
            del self._in_use[lora]
            if lora not in self.held:  # dropped while it ran
                self.loaded.pop(lora, None)
                self._draining.discard(lora)

    def cancel(self, request_id: str) -> P | None:
        """Take a waiting request out (its payload), or None if it is not waiting."""
        for w in self._waiting:
            if w.request_id == request_id:
                self._waiting.remove(w)
                return w.payload
        return None

    def take_all(self) -> list[P]:
        """Every waiting request, taken out (shutdown)."""
        taken = [w.payload for w in self._waiting]
        self._waiting.clear()
        return taken

    def advance(self, now: float) -> list[P]:
        """Land the loads due by ``now``, start the loads waiting requests need (draining a
        slot when none can be freed), and return the requests that may enter the engine, in
        arrival order."""
        for name, ready_at in list(self.loading.items()):
            if ready_at <= now:
                del self.loading[name]
                self.loaded[name] = None
        if not any(w.lora not in self.loaded and w.lora not in self.loading for w in self._waiting):
            self._draining.clear()  # nobody needs a slot any more: they take requests again
        ready: list[P] = []
        still: deque[_Waiting[P]] = deque()
        for w in self._waiting:
            if w.lora not in self.loaded and w.lora not in self.loading:
                if self._make_room():
                    self._start_load(w.lora, now)
                else:
                    self._drain_one()
            if w.lora in self.loaded and w.lora not in self._draining:
                self._enter(w.request_id, w.lora)
                ready.append(w.payload)
            else:
                still.append(w)
        self._waiting = still
        return ready

    def next_ready_at(self) -> float | None:
        """When the next load ends (None: none in progress)."""
        return min(self.loading.values(), default=None)

    # --- internals -----------------------------------------------------------------------------
    def _enter(self, request_id: str, lora: str) -> None:
        self._of[request_id] = lora
        self._in_use[lora] += 1
        self.loaded.move_to_end(lora)

    def _free_slots(self) -> int:
        return self.max_loras - len(self.loaded) - len(self.loading)

    def _make_room(self) -> bool:
        """A free slot, evicting the least recently used adapter no request uses if needed
        (a draining one first)."""
        if self._free_slots() > 0:
            return True
        idle = [name for name in self.loaded if not self._in_use[name]]
        if not idle:
            return False
        victim = next((n for n in idle if n in self._draining), idle[0])
        del self.loaded[victim]
        self._draining.discard(victim)
        return True

    def _drain_one(self) -> None:
        """No slot can be freed now: let the least recently used loaded adapter drain (one at
        a time), so its slot frees when its running requests end."""
        if self._draining:
            return
        wanted = {w.lora for w in self._waiting}
        for name in self.loaded:
            if name not in wanted:
                self._draining.add(name)
                return

    def _start_load(self, name: str, now: float) -> None:
        self.loads += 1
        if self.load_time_s <= 0:
            self.loaded[name] = None
        else:
            self.loading[name] = now + self.load_time_s
