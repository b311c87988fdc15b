"""The prefill phases this router replica has sent and waits on (disaggregated serving).

The router that routed a disaggregated request sends its prefill phase to the prefill worker and
waits for the answer (``PrefillResult`` or ``RequestFailed`` on ``subjects.prefill_result``),
then sends the decode phase. While it waits, the prefill can also end because the prefill worker
was found lost (this replica's probe or a peer's ``WorkerLost``), because the request bounced off
a worker gone since its heartbeat, because the client went away (``Cancel``), or because no answer
came in time. ``PrefillWaits`` turns each of those into the outcome the waiting task acts on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from shared.messages import PrefillResult, RequestFailed

Ended = Literal["lost", "bounced", "timeout", "cancelled"]
Outcome = PrefillResult | RequestFailed | Ended


@dataclass(slots=True)
class _Wait:
    worker_id: str
    future: asyncio.Future[Outcome]


class PrefillWaits:
    """Request id -> the prefill it waits on (one at a time per request)."""

    def __init__(self) -> None:
        self._waits: dict[str, _Wait] = {}

    def __len__(self) -> int:
        return len(self._waits)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waits

    async def wait(self, request_id: str, worker_id: str, timeout_s: float) -> Outcome:
        """Wait for the end of ``request_id``'s prefill on ``worker_id`` (register before the
        ``Generate`` goes out: call ``expect`` first)."""
        wait = self._waits.get(request_id)
        if wait is None or wait.worker_id != worker_id:
            raise RuntimeError(f"no prefill of {request_id} expected on {worker_id}")
        try:
            return await asyncio.wait_for(asyncio.shield(wait.future), timeout_s)
        except TimeoutError:
            return "timeout"
        finally:
            if self._waits.get(request_id) is wait:
                del self._waits[request_id]

    def expect(self, request_id: str, worker_id: str) -> None:
        """A prefill of ``request_id`` is about to go to ``worker_id``."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waits[request_id] = _Wait(worker_id, future)

    def answer(self, message: PrefillResult | RequestFailed) -> bool:
        """A prefill worker's answer; False when nobody waits for it (late, or a peer's)."""
        wait = self._waits.get(message.request_id)
        if wait is None:
            return False
        if isinstance(message, PrefillResult) and message.worker_id != wait.worker_id:
            return False  # an earlier attempt's answer, after a retry elsewhere
        return self._end(wait, message)

    def end(self, request_id: str, why: Ended) -> bool:
        """End one request's prefill (a bounce, a cancel)."""
        wait = self._waits.get(request_id)
        return wait is not None and self._end(wait, why)

    def lost(self, worker_id: str) -> list[str]:
        """A worker was lost: end every prefill waiting on it; their request ids."""
        ended = [r for r, w in self._waits.items() if w.worker_id == worker_id]
        for request_id in ended:
            self._end(self._waits[request_id], "lost")
        return ended

    @staticmethod
    def _end(wait: _Wait, outcome: Outcome) -> bool:
        if wait.future.done():
            return False
        wait.future.set_result(outcome)
        return True
