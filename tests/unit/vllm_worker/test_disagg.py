"""Disaggregated and data-parallel vLLM, the pure parts: what each phase asks vLLM, the settings
that go with it, where each data-parallel rank publishes, and the rank on every KV event.

The phases follow vLLM's disaggregated serving proxy
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` at commit
030ea52effcb05071543c8c42b8f0145e94cee43): a prefill request is the original with
``max_tokens`` 1, ``min_tokens`` dropped, ``stream`` false, ``stream_options`` dropped and
``PROXY_PREFILL`` as its ``kv_transfer_params``; the decode request is the original with the
prefill response's ``kv_transfer_params``. Rank endpoints follow
``ZmqEventPublisher.offset_endpoint_port`` (``vllm/distributed/kv_events.py``, commit
0181ea3173e53eea8cf04a86891488e3dc89bb34).
"""

from __future__ import annotations

from typing import Any

import pytest

from services.vllm_worker.config import VllmWorkerConfig, parse_kv_transfer_config
from services.vllm_worker.engine import check_request, transfer_params
from services.vllm_worker.kv_endpoints import (
    loopback_sources,
    offset_endpoint,
    overlapping,
    rank_sources,
)
from services.vllm_worker.kv_relay import KvRelay
from services.vllm_worker.kv_wire import (
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEvent,
    VllmEventBatch,
)
from services.vllm_worker.remote import RemoteVllmEngine
from services.vllm_worker.sampling import (
    PREFILL_KV_TRANSFER_PARAMS,
    completions_body,
    engine_kwargs,
    kv_transfer_params,
)
from services.vllm_worker.service import engine_factory
from services.vllm_worker.stats import SchedulerSnapshot
from shared.config import SettingError
from shared.messages import AllBlocksCleared, BlockRemoved, BlockStored, SamplingParams
from shared.worker.records import EngineError, EngineInput

PROXY_PREFILL = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""``send_request_to_service``'s ``req_data["kv_transfer_params"]``, copied from the proxy."""

NIXL_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [0, 1, 2],
    "remote_engine_id": "prefill-engine",
    "remote_request_id": "r1-1a2b3c4d",
    "remote_host": "10.0.0.7",
    "remote_port": 5601,
    "tp_size": 1,
}
"""What ``NixlConnectorScheduler.request_finished`` returns (commit 002a1057e9ae)."""

NIXL = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
SAMPLING = SamplingParams(max_tokens=40, min_tokens=5, seed=7)


# --- what each phase asks vLLM ------------------------------------------------------------------


def test_the_prefill_params_are_the_proxys() -> None:
    assert PREFILL_KV_TRANSFER_PARAMS == PROXY_PREFILL
    assert kv_transfer_params("prefill", None) == PROXY_PREFILL
    assert kv_transfer_params("prefill", NIXL_PARAMS) == PROXY_PREFILL
    assert kv_transfer_params("prefill", None) is not PREFILL_KV_TRANSFER_PARAMS  # a copy


def test_the_decode_params_are_the_prefills_verbatim_and_a_copy() -> None:
    params = kv_transfer_params("decode", NIXL_PARAMS)
    assert params == NIXL_PARAMS
    assert params is not NIXL_PARAMS  # vLLM's connector writes into what it gets
    assert kv_transfer_params("decode", None) is None  # the proxy sends none: a local prefill
    assert kv_transfer_params("decode", {}) is None
    assert kv_transfer_params("both", NIXL_PARAMS) is None


def test_engine_kwargs_per_phase() -> None:
    both = engine_kwargs(SAMPLING)
    assert "extra_args" not in both
    assert both["max_tokens"] == 40
    assert both["min_tokens"] == 5

    prefill = engine_kwargs(SAMPLING, phase="prefill")
    assert prefill["extra_args"] == {"kv_transfer_params": PROXY_PREFILL}
    assert prefill["max_tokens"] == 1
    assert "min_tokens" not in prefill  # vLLM's default, 0
    rest = {k: v for k, v in prefill.items() if k not in ("extra_args", "max_tokens")}
    assert rest == {k: v for k, v in both.items() if k not in ("max_tokens", "min_tokens")}

    decode = engine_kwargs(SAMPLING, phase="decode", kv_transfer=NIXL_PARAMS)
    assert decode["extra_args"] == {"kv_transfer_params": NIXL_PARAMS}
    assert {k: v for k, v in decode.items() if k != "extra_args"} == both

    assert engine_kwargs(SAMPLING, phase="decode") == both  # no params: as the proxy, none


def test_completions_body_per_phase() -> None:
    ids = (1, 2, 3)
    both = completions_body(ids, SAMPLING, model="m")
    assert both["stream"] is True
    assert "kv_transfer_params" not in both

    prefill = completions_body(ids, SAMPLING, model="m", phase="prefill")
    assert prefill["kv_transfer_params"] == PROXY_PREFILL
    assert prefill["stream"] is False
    assert "stream_options" not in prefill
    assert prefill["max_tokens"] == 1
    assert "min_tokens" not in prefill
    # the proxy's transformation of the original request, and nothing else
    proxy = {k: v for k, v in both.items() if k not in ("stream_options", "min_tokens")}
    proxy.update(stream=False, max_tokens=1, kv_transfer_params=PROXY_PREFILL)
    assert prefill == proxy

    decode = completions_body(ids, SAMPLING, model="m", phase="decode", kv_transfer=NIXL_PARAMS)
    assert decode == {**both, "kv_transfer_params": NIXL_PARAMS}


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_several_choices_do_not_run_disaggregated(phase: Any) -> None:
    with pytest.raises(EngineError, match="n > 1"):
        engine_kwargs(SamplingParams(n=2), phase=phase, kv_transfer=NIXL_PARAMS)
    with pytest.raises(EngineError, match="n > 1"):
        completions_body((1,), SamplingParams(n=2), model="m", phase=phase)
    engine_kwargs(SamplingParams(n=2))  # aggregated: fine


def test_transfer_params_of_a_request_output() -> None:
    class Output:
        def __init__(self, params: Any) -> None:
            self.kv_transfer_params = params

    assert transfer_params(Output(NIXL_PARAMS)) == NIXL_PARAMS  # type: ignore[arg-type]
    assert transfer_params(Output([NIXL_PARAMS])) == NIXL_PARAMS  # type: ignore[arg-type]
    assert transfer_params(Output(None)) is None  # type: ignore[arg-type]
    assert transfer_params(Output({})) is None  # type: ignore[arg-type]
    assert transfer_params(object()) is None  # type: ignore[arg-type]


def test_a_rank_out_of_range_is_refused() -> None:
    request = EngineInput(
        request_id="r", token_ids=(1, 2), sampling=SamplingParams(), hash_seed=0, dp_rank=2
    )
    with pytest.raises(EngineError, match="rank 2"):
        check_request(request, 0, 2)
    check_request(request, 0, 3)


# --- settings -----------------------------------------------------------------------------------


def test_prefill_and_decode_roles_need_a_kv_connector_in_process() -> None:
    for role in ("prefill", "decode"):
        with pytest.raises(SettingError, match="--kv-transfer-config"):
            VllmWorkerConfig(role=role)
        with pytest.raises(SystemExit):
            VllmWorkerConfig.from_cli(["--role", role])
        config = VllmWorkerConfig.from_cli(["--role", role, "--kv-transfer-config", NIXL])
        assert config.kv_transfer() == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert VllmWorkerConfig.from_cli([]).kv_transfer() is None


@pytest.mark.parametrize(
    ("text", "role", "match"),
    [
        ("{nope", "both", "not JSON"),
        ('["NixlConnector"]', "both", "JSON object"),
        ('{"kv_role": "kv_both"}', "both", "kv_connector"),
        ('{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}', "prefill", "kv_role"),
        ('{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}', "decode", "kv_role"),
        ('{"kv_connector": "NixlConnector", "kv_role": "kv_nothing"}', "both", "kv_role"),
    ],
)
def test_kv_transfer_configs_refused(text: str, role: str, match: str) -> None:
    with pytest.raises(SettingError, match=match):
        parse_kv_transfer_config(text, role)


def test_remote_mode_leaves_the_connector_to_the_server() -> None:
    with pytest.raises(SettingError, match="vllm serve --kv-transfer-config"):
        VllmWorkerConfig(engine_url="http://a:1", kv_transfer_config=NIXL)
    config = VllmWorkerConfig.from_cli(["--engine-url", "http://a:1", "--role", "prefill"])
    assert config.role == "prefill"
    assert config.kv_transfer() is None


def test_pin_timeout_is_the_connectors() -> None:
    prefill = VllmWorkerConfig.from_cli(["--role", "prefill", "--kv-transfer-config", NIXL])
    assert prefill.kv_pin_timeout_s({}) == 480.0
    assert prefill.kv_pin_timeout_s({"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "30"}) == 30.0
    decode = VllmWorkerConfig.from_cli(["--role", "decode", "--kv-transfer-config", NIXL])
    assert decode.kv_pin_timeout_s({}) == 0.0
    other = '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'
    lmcache = VllmWorkerConfig.from_cli(["--role", "prefill", "--kv-transfer-config", other])
    assert lmcache.kv_pin_timeout_s({}) == 0.0


def test_remote_data_parallel_endpoints_must_not_overlap() -> None:
    remote: dict[str, Any] = {"engine_url": "http://a:1", "data_parallel_size": 2}
    with pytest.raises(SettingError, match="overlap at tcp://a:5558"):
        VllmWorkerConfig(
            **remote, kv_events_endpoint="tcp://a:5557", kv_replay_endpoint="tcp://a:5558"
        )
    config = VllmWorkerConfig(
        **remote, kv_events_endpoint="tcp://a:5557", kv_replay_endpoint="tcp://a:5657"
    )
    assert config.data_parallel_size == 2
    with pytest.raises(SettingError, match="ipc"):
        VllmWorkerConfig(**remote, kv_events_endpoint="ipc:///tmp/kv")
    VllmWorkerConfig(engine_url="http://a:1", kv_events_endpoint="ipc:///tmp/kv")  # 1 rank


# --- rank endpoints -----------------------------------------------------------------------------


def test_offset_endpoint_is_vllms() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint("inproc://cache", 1) == "inproc://cache_dp1"
    assert offset_endpoint("ipc:///tmp/kv.sock", 0) == "ipc:///tmp/kv.sock"
    with pytest.raises(ValueError, match="tcp"):
        offset_endpoint("ipc:///tmp/kv.sock", 1)


def test_rank_sources_and_overlaps() -> None:
    sources = rank_sources("tcp://h:5557", "tcp://h:5657", "kv", 3)
    assert [(s.endpoint, s.replay_endpoint, s.dp_rank) for s in sources] == [
        ("tcp://h:5557", "tcp://h:5657", 0),
        ("tcp://h:5558", "tcp://h:5658", 1),
        ("tcp://h:5559", "tcp://h:5659", 2),
    ]
    assert overlapping(sources) == []
    assert overlapping(rank_sources("tcp://h:5557", "tcp://h:5558", "", 2)) == ["tcp://h:5558"]


def test_loopback_sources_for_in_process_ranks() -> None:
    endpoint, replay, sources = loopback_sources(3, "kv")
    assert endpoint.startswith("tcp://127.0.0.1:")
    assert replay.startswith("tcp://127.0.0.1:")
    assert [s.dp_rank for s in sources] == [0, 1, 2]
    assert all(s.bind and s.topic == "kv" for s in sources)  # vLLM connects to 127.0.0.1
    ends = [e for s in sources for e in (s.endpoint, s.replay_endpoint) if e is not None]
    ports = {int(e.rsplit(":", 1)[1]) for e in ends}
    assert len(ports) == 6
    assert sources[2].endpoint == offset_endpoint(endpoint, 2)


# --- the rank on KV events ----------------------------------------------------------------------

BS = 4
TOKENS = tuple(range(100, 112))


def batch(rank: int | None, *events: VllmEvent) -> VllmEventBatch:
    return VllmEventBatch(ts=0.0, events=events, data_parallel_rank=rank)


def stored(hashes: list[int], parent: int | None = None, first: int = 0) -> VllmBlockStored:
    return VllmBlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=parent,
        token_ids=TOKENS[first * BS : (first + len(hashes)) * BS],
        block_size=BS,
    )


def test_every_event_carries_the_batchs_rank() -> None:
    relay = KvRelay(block_size=BS)
    (stored_event,) = relay.relay(batch(3, stored([1, 2])))
    assert isinstance(stored_event, BlockStored)
    assert stored_event.dp_rank == 3
    (removed,) = relay.relay(batch(3, VllmBlockRemoved(block_hashes=(2,))))
    assert removed == BlockRemoved(block_hashes=(stored_event.block_hashes[1],), dp_rank=3)
    (dumped,) = relay.dump(with_tokens=False)
    assert dumped.dp_rank == 3
    assert relay.relay(batch(3, VllmAllBlocksCleared())) == [AllBlocksCleared(dp_rank=3)]
    assert relay.lost(10) == [AllBlocksCleared(dp_rank=3)]


def test_a_batch_without_a_rank_keeps_the_relays() -> None:
    relay = KvRelay(block_size=BS, dp_rank=1)
    (event,) = relay.relay(batch(None, stored([1])))
    assert event.dp_rank == 1
    rank0 = KvRelay(block_size=BS)
    (event,) = rank0.relay(batch(0, stored([1])))
    assert isinstance(event, BlockStored)
    assert event == BlockStored(
        block_hashes=event.block_hashes, token_ids=TOKENS[:BS], block_size=BS
    )  # rank 0 is the default: nothing changes on the wire


def test_scheduler_stats_of_several_engine_cores_add_up() -> None:
    snapshot = SchedulerSnapshot()
    snapshot.update(running=3, waiting=1, kv_usage=0.5, engine=0)
    snapshot.update(running=2, waiting=0, kv_usage=0.1, engine=1)
    snapshot.update(running=1, waiting=4, kv_usage=0.3, engine=0)
    assert (snapshot.running, snapshot.waiting) == (3, 4)
    assert snapshot.kv_usage == pytest.approx(0.2)


def test_the_remote_engine_gets_the_servers_rank_count() -> None:
    config = VllmWorkerConfig(engine_url="http://a:1", data_parallel_size=4, worker_id="w")
    engine = engine_factory(config)(config.worker_ids()[0])
    assert isinstance(engine, RemoteVllmEngine)
    assert engine.options.dp_size == 4
