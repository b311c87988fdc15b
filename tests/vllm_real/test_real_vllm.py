"""The vLLM worker against vLLM's own code (``make test-vllm``; skipped without vllm).

- the relay decodes what vLLM's own ``vllm.distributed.kv_events`` structs encode, and what its
  ``ZmqEventPublisher`` sends over a real socket (including the replay of batches published
  before the subscriber joined);
- ``sampling.engine_kwargs`` builds a real ``vllm.SamplingParams`` through
  ``loader.make_sampling_params``.

No GPU and no model are needed: nothing here starts an engine.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import msgspec
import pytest

vllm = pytest.importorskip("vllm")
kv_events = pytest.importorskip("vllm.distributed.kv_events")
zmq = pytest.importorskip("zmq")

from services.vllm_worker.kv_relay import KvRelay  # noqa: E402
from services.vllm_worker.kv_wire import (  # noqa: E402
    VllmBlockRemoved,
    VllmBlockStored,
    decode_batch,
)
from services.vllm_worker.sampling import engine_kwargs  # noqa: E402
from services.vllm_worker.zmq_events import KvEventSubscriber  # noqa: E402
from shared.hashing import prefix_hashes  # noqa: E402
from shared.messages import AnyKvEvent, BlockRemoved, BlockStored, Guided, SamplingParams  # noqa: E402
from tests.support import eventually_async  # noqa: E402

BS = 16
TOKENS = list(range(1000, 1064))  # 4 blocks


def _fields(cls: Any) -> tuple[str, ...]:
    return tuple(cls.__struct_fields__)


def real_stored(hashes: list[int], parent: int | None, tokens: list[int]) -> Any:
    """vLLM's ``BlockStored`` with whatever fields this version requires."""
    values: dict[str, Any] = {
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    names = _fields(kv_events.BlockStored)
    return kv_events.BlockStored(**{k: v for k, v in values.items() if k in names})


def real_removed(hashes: list[int]) -> Any:
    values: dict[str, Any] = {"block_hashes": hashes, "medium": "GPU"}
    names = _fields(kv_events.BlockRemoved)
    return kv_events.BlockRemoved(**{k: v for k, v in values.items() if k in names})


def real_batch(events: list[Any]) -> Any:
    return kv_events.KVEventBatch(ts=time.time(), events=events)


def test_relay_reads_vllms_own_encoding() -> None:
    encoder = msgspec.msgpack.Encoder()  # what ZmqEventPublisher._publisher_thread uses
    first = decode_batch(encoder.encode(real_batch([real_stored([11, 12], None, TOKENS[:32])])))
    second = decode_batch(
        encoder.encode(real_batch([real_stored([13, 14], 12, TOKENS[32:]), real_removed([11])]))
    )
    (stored,) = first.events
    assert isinstance(stored, VllmBlockStored)
    assert stored.block_hashes == (11, 12)
    assert isinstance(second.events[1], VllmBlockRemoved)
    relay = KvRelay(block_size=BS)
    out = relay.relay(first) + relay.relay(second)
    expected = prefix_hashes(TOKENS, BS)
    assert out[0] == BlockStored(
        block_hashes=tuple(expected[:2]),
        parent_hash=None,
        token_ids=tuple(TOKENS[:32]),
        block_size=BS,
    )
    assert out[1] == BlockStored(
        block_hashes=tuple(expected[2:]),
        parent_hash=expected[1],
        token_ids=tuple(TOKENS[32:]),
        block_size=BS,
    )
    assert out[2] == BlockRemoved(block_hashes=(expected[0],))


def _publisher() -> Any:
    kwargs: dict[str, Any] = {
        "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*",
        "topic": "kv",
    }
    if "data_parallel_rank" in inspect.signature(kv_events.ZmqEventPublisher).parameters:
        kwargs["data_parallel_rank"] = 0
    return kv_events.ZmqEventPublisher(**kwargs)


def _endpoint(socket: Any) -> str:
    value = socket.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)


async def test_subscriber_follows_the_real_zmq_publisher_and_its_replay() -> None:
    publisher = _publisher()
    try:
        # Published before anyone subscribes: only the replay socket can bring it.
        publisher.publish(real_batch([real_stored([1, 2], None, TOKENS[:32])]))
        await asyncio.sleep(0.3)
        received: list[AnyKvEvent] = []
        relay = KvRelay(block_size=BS)
        subscriber = KvEventSubscriber(
            relay,
            _endpoint(publisher._pub),
            received.extend,
            replay_endpoint=_endpoint(publisher._replay),
            topic="kv",
            idle_replay_s=0.2,
        )
        await subscriber.start()
        try:
            await eventually_async(
                lambda: received, timeout_s=5, message="the replayed batch never came"
            )
            publisher.publish(real_batch([real_stored([3, 4], 2, TOKENS[32:]), real_removed([1])]))
            await eventually_async(
                lambda: len(received) >= 3,
                timeout_s=5,
                message=lambda: f"live batches never came: {received}",
            )
        finally:
            await subscriber.stop()
    finally:
        publisher.shutdown()
    expected = prefix_hashes(TOKENS, BS)
    stored = [h for e in received if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == expected
    assert received[2] == BlockRemoved(block_hashes=(expected[0],))
    assert relay.next_seq == 2


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(),
        SamplingParams(greedy=True, max_tokens=3),
        SamplingParams(
            temperature=0.7,
            top_p=0.9,
            top_k=20,
            min_p=0.1,
            seed=3,
            n=2,
            logprobs=2,
            presence_penalty=0.5,
            frequency_penalty=0.2,
            repetition_penalty=1.1,
            stop_token_ids=(2,),
            min_tokens=1,
            ignore_eos=True,
            logit_bias={5: 1.0},
        ),
        SamplingParams(guided=Guided(json_schema={"type": "object"})),
        SamplingParams(guided=Guided(json_object=True)),
    ],
)
def test_sampling_kwargs_build_a_real_sampling_params(sampling: SamplingParams) -> None:
    from services.vllm_worker.loader import make_sampling_params

    params = make_sampling_params(engine_kwargs(sampling))
    assert isinstance(params, vllm.SamplingParams)
    assert params.max_tokens == sampling.max_tokens
    assert params.n == sampling.n
    assert params.output_kind.name == "DELTA"
    assert params.detokenize is False
    assert list(params.stop_token_ids or ()) == list(sampling.stop_token_ids)
    if sampling.guided is not None:
        assert params.structured_outputs is not None


def test_agent_kwargs_build_a_real_sampling_params() -> None:
    """A forced tool call's structural tag and a thinking budget, with what the installed vLLM
    says it can do (``loader.features``), build vLLM's own ``SamplingParams``; xgrammar compiles
    the tag."""
    import xgrammar

    from services.vllm_worker.loader import features, make_sampling_params

    found = features()
    tools = ({"name": "f", "parameters": {"type": "object", "properties": {}}},)
    guided = Guided(
        tools=tools,
        tool_choice="required",
        tool_syntax="hermes",
        parallel_tool_calls=False,
        reasoning_syntax="qwen3",
        max_thinking_tokens=16 if found.thinking_budget else None,
    )
    params = make_sampling_params(engine_kwargs(SamplingParams(guided=guided), features=found))
    assert params.structured_outputs.structural_tag is not None
    xgrammar.Grammar.from_structural_tag(params.structured_outputs.structural_tag)
    if found.thinking_budget:
        assert params.thinking_token_budget == 16


def test_phase_kwargs_build_a_real_sampling_params() -> None:
    """A prefill's and a decode's ``kv_transfer_params`` reach ``SamplingParams.extra_args``,
    where vLLM's ``Request`` reads them (``Request.kv_transfer_params``)."""
    from services.vllm_worker.loader import make_sampling_params
    from services.vllm_worker.sampling import PREFILL_KV_TRANSFER_PARAMS

    sampling = SamplingParams(max_tokens=20, min_tokens=2)
    prefill = make_sampling_params(engine_kwargs(sampling, phase="prefill"))
    assert prefill.max_tokens == 1
    assert prefill.min_tokens == 0
    assert prefill.extra_args == {"kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS}
    handed = {"do_remote_prefill": True, "remote_block_ids": [1], "remote_engine_id": "e"}
    decode = make_sampling_params(engine_kwargs(sampling, phase="decode", kv_transfer=handed))
    assert decode.max_tokens == 20
    assert decode.extra_args == {"kv_transfer_params": handed}
