"""Session names shared by routers and workers (``RoutingHints.session_id``). Pure.

A session id is whatever a client sent (``X-Dynamo-Session-ID``); it becomes a KV key and a
request id only through these functions, which hash it into a safe token.
"""

from __future__ import annotations

import hashlib


def session_key(model: str, session_id: str) -> str:
    """The session bucket's key of a session of ``model``."""
    return hashlib.sha256(f"{model}\0{session_id}".encode()).hexdigest()[:40]


def speculative_request_id(request_id: str, model: str, session_id: str | None) -> str:
    """The request id of the speculative prefill a finished turn starts on its worker: one per
    session (a router that sends the next turn elsewhere cancels it by this id), else one per
    turn."""
    if session_id is None:
        return f"{request_id}-spec"
    return f"spec-{session_key(model, session_id)}"
