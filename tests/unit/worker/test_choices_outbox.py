"""The outbox with ``n`` choices: a buffer, index and last batch per choice, logprobs carried,
the request closed once every choice sent its last batch."""

from __future__ import annotations

from shared.messages import TokenBatch, TokenLogprob
from shared.worker.outbox import Outbox
from shared.worker.records import Emission


def _em(choice: int, index: int, *tokens: int, finish: str | None = None) -> Emission:
    return Emission(
        request_id="r",
        token_ids=tokens,
        index=index,
        finish_reason=finish,  # type: ignore[arg-type]
        choice=choice,
        logprobs=tuple(TokenLogprob(-0.5, ((t, -0.5),)) for t in tokens),
    )


def _drain(box: Outbox) -> list[TokenBatch]:
    out = []
    while (taken := box.take("r")) is not None:
        out.append(taken[1])
    return out


def test_each_choice_gets_its_own_batches_and_index() -> None:
    box = Outbox("w")
    box.open("r", "s", prompt_tokens=4, n=2)
    assert box.add(_em(0, 0, 10)) is True
    assert box.add(_em(1, 0, 20)) is True
    first = _drain(box)
    assert [(b.choice, b.token_ids, b.index, b.prompt_tokens) for b in first] == [
        (0, (10,), 0, 4),
        (1, (20,), 0, 4),
    ]
    assert box.add(_em(1, 1, 21)) is False
    box.add(_em(1, 2, 22))
    (batch,) = _drain(box)
    assert (batch.choice, batch.token_ids, batch.index, batch.prompt_tokens) == (1, (21, 22), 1, 0)
    assert [lp.top[0][0] for lp in batch.logprobs] == [21, 22]


def test_a_choice_finishes_alone_and_the_request_closes_with_the_last() -> None:
    box = Outbox("w")
    box.open("r", "s", prompt_tokens=4, n=2)
    box.add(_em(0, 0, 10, finish="length"))
    box.add(_em(1, 0, 20))
    batches = _drain(box)
    assert [(b.choice, b.finish_reason) for b in batches] == [(0, "length"), (1, None)]
    assert "r" in box
    assert box.add(_em(0, 1, 11)) is False  # a finished choice takes nothing more
    box.add(_em(1, 1, 7, finish="stop"))
    assert [(b.choice, b.finish_reason) for b in _drain(box)] == [(1, "stop")]
    assert "r" not in box
    assert box.dirty() == []
