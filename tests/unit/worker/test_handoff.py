"""The worker's disaggregation bookkeeping (``Handoffs``) and the placement its batches carry
(``Outbox``): a prefill phase's last emission becomes ``PrefillResult`` for its router, a cancel
or failure a ``RequestFailed`` there; a decode phase's release is owed once; an aggregated
request's batches are encoded exactly as before."""

from __future__ import annotations

from shared import codec
from shared.errors import ShuttingDown
from shared.messages import (
    Generate,
    KvTransfer,
    PrefillResult,
    RequestFailed,
    SamplingParams,
    TokenBatch,
)
from shared.worker.handoff import Handoffs
from shared.worker.outbox import Outbox
from shared.worker.records import Emission

PARAMS = {"engine": "mocker", "block_hashes": [1, 2], "num_blocks": 2}


def _gen(rid: str = "r", **kwargs: object) -> Generate:
    return Generate(
        request_id=rid,
        model="m",
        token_ids=(1, 2, 3, 4, 5),
        sampling=SamplingParams(max_tokens=9),
        stream_to="s",
        prefill_to="router.r1.prefilled",
        **kwargs,  # type: ignore[arg-type]
    )


def _done(rid: str = "r", **kwargs: object) -> Emission:
    fields: dict[str, object] = {
        "request_id": rid,
        "token_ids": (42,),
        "index": 0,
        "finish_reason": "length",
        "prompt_tokens": 5,
        "cached_tokens": 4,
        "done": True,
        "kv_transfer_params": PARAMS,
    }
    fields.update(kwargs)
    return Emission(**fields)  # type: ignore[arg-type]


class TestPrefillPhase:
    def test_the_last_emission_becomes_the_prefill_result(self) -> None:
        handoffs = Handoffs("pw", pin_timeout_s=30.0)
        handoffs.open_prefill(_gen(dp_rank=1, attempt=2))
        assert handoffs.attempt("r") == 2
        assert handoffs.add(_done(), now=100.0)
        assert handoffs.attempt("r") is None
        ((subject, result),) = handoffs.take_ready()
        assert subject == "router.r1.prefilled"
        assert result == PrefillResult(
            request_id="r",
            worker_id="pw",
            dp_rank=1,
            kv_transfer=KvTransfer(
                source_worker_id="pw", source_dp_rank=1, params=PARAMS, expires_at=130.0
            ),
            token_ids=(42,),
            prompt_tokens=5,
            cached_tokens=4,
        )
        assert handoffs.take_ready() == []

    def test_an_engine_without_a_pin_timeout_leaves_expiry_unknown(self) -> None:
        handoffs = Handoffs("pw")
        handoffs.open_prefill(_gen())
        handoffs.add(_done(kv_transfer_params=None), now=100.0)
        ((_, result),) = handoffs.take_ready()
        assert isinstance(result, PrefillResult)
        assert (result.kv_transfer.expires_at, result.kv_transfer.params) == (0.0, {})

    def test_a_cancelled_prefill_fails_on_its_routers_subject(self) -> None:
        handoffs = Handoffs("pw", pin_timeout_s=30.0)
        handoffs.open_prefill(_gen())
        cancelled = _done(token_ids=(), finish_reason="cancelled", kv_transfer_params=None)
        assert handoffs.add(cancelled, now=1.0)
        ((subject, failed),) = handoffs.take_ready()
        assert subject == "router.r1.prefilled"
        assert isinstance(failed, RequestFailed)
        assert (failed.code, failed.status, failed.retry_after_s) == ("cancelled", 499, None)

    def test_a_failure_goes_to_the_router(self) -> None:
        handoffs = Handoffs("pw")
        handoffs.open_prefill(_gen())
        assert handoffs.fail("r", ShuttingDown("bye"))
        assert not handoffs.fail("r", ShuttingDown("bye"))
        ((_, failed),) = handoffs.take_ready()
        assert isinstance(failed, RequestFailed)
        assert failed.code == "shutting_down"

    def test_emissions_of_other_requests_are_not_its_business(self) -> None:
        handoffs = Handoffs("pw")
        assert not handoffs.add(_done("other"), now=1.0)
        assert handoffs.take_ready() == []


class TestReleasesAndRanks:
    def test_a_release_is_owed_once(self) -> None:
        handoffs = Handoffs("dw")
        handoffs.releases["r"] = "ns.worker.pw.kv_release"
        assert handoffs.pop_release("r") == "ns.worker.pw.kv_release"
        assert handoffs.pop_release("r") is None

    def test_ranks_default_to_zero(self) -> None:
        handoffs = Handoffs("w")
        handoffs.ranks["r"] = 3
        assert (handoffs.rank("r"), handoffs.rank("x")) == (3, 0)
        assert handoffs.pop_rank("r") == 3
        assert handoffs.pop_rank("r") == 0


class TestOutboxPlacement:
    def _batch(self, **placement: object) -> TokenBatch:
        outbox = Outbox("dw")
        outbox.open("r", "s", prompt_tokens=5, **placement)  # type: ignore[arg-type]
        outbox.add(
            Emission(request_id="r", token_ids=(7,), index=0, done=True, finish_reason="stop")
        )
        taken = outbox.take("r")
        assert taken is not None
        return taken[1]

    def test_a_decode_phase_names_its_prefill_worker_and_ranks(self) -> None:
        batch = self._batch(dp_rank=1, prefill_worker_id="pw", prefill_dp_rank=2)
        assert (batch.dp_rank, batch.prefill_worker_id, batch.prefill_dp_rank) == (1, "pw", 2)

    def test_an_aggregated_batch_is_encoded_as_before(self) -> None:
        plain = TokenBatch(
            request_id="r",
            token_ids=(7,),
            finish_reason="stop",
            prompt_tokens=5,
            worker_id="dw",
        )
        assert codec.encode(self._batch()) == codec.encode(plain)
