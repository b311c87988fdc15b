"""Outbox: emissions become TokenBatch messages with the right index, first and last fields."""

from __future__ import annotations

from shared.worker.outbox import Outbox
from shared.worker.records import Emission


def _em(index: int, *tokens: int, finish: str | None = None, stop: int | None = None) -> Emission:
    return Emission(
        request_id="r",
        token_ids=tokens,
        index=index,
        finish_reason=finish,  # type: ignore[arg-type]
        stop_token_id=stop,
    )


def _outbox() -> Outbox:
    box = Outbox("w1")
    box.open("r", "stream.r", prompt_tokens=5)
    return box


def test_first_token_is_urgent_and_carries_prompt_tokens() -> None:
    box = _outbox()
    assert box.add(_em(0, 11)) is True
    subject, batch = box.take("r") or ("", None)
    assert subject == "stream.r"
    assert batch is not None
    assert (batch.token_ids, batch.index, batch.prompt_tokens, batch.worker_id) == (
        (11,),
        0,
        5,
        "w1",
    )


def test_later_tokens_accumulate_into_one_batch() -> None:
    box = _outbox()
    box.add(_em(0, 11))
    box.take("r")
    assert box.add(_em(1, 12)) is False
    box.add(_em(2, 13))
    _, batch = box.take("r") or ("", None)
    assert batch is not None
    assert (batch.token_ids, batch.index, batch.prompt_tokens) == ((12, 13), 1, 0)


def test_finish_is_urgent_and_closes_the_request() -> None:
    box = _outbox()
    box.add(_em(0, 11))
    box.take("r")
    assert box.add(_em(1, 7, finish="stop", stop=7)) is True
    _, batch = box.take("r") or ("", None)
    assert batch is not None
    assert (batch.finish_reason, batch.stop_token_id, batch.token_ids) == ("stop", 7, (7,))
    assert "r" not in box


def test_emissions_after_cancel_are_dropped() -> None:
    box = _outbox()
    box.add(_em(0, finish="cancelled"))
    box.take("r")
    assert box.add(_em(0, 11)) is False
    assert box.take("r") is None


def test_dirty_lists_requests_with_something_to_send() -> None:
    box = _outbox()
    assert box.dirty() == []
    box.add(_em(0, 11))
    assert box.dirty() == ["r"]
    box.take("r")
    assert box.dirty() == []
