"""JetStream replicas: one setting, created at that count, scaled up and never down, never a crash.

A hand-written fake of the few ``JetStreamContext`` calls the helpers make (streams by name, the
KV and object-store views on them), so the decisions are tested without a server;
``docs/operations.md`` says what a real 3-node cluster did.
"""

from __future__ import annotations

from typing import Any

import nats.errors
import pytest
from nats.js.api import ClusterInfo, PeerInfo, StreamConfig, StreamInfo, StreamState
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    NotFoundError,
    ObjectNotFoundError,
    ServerError,
)
from structlog.testing import capture_logs

from services.cli.config import service_configs
from services.router.metrics import RouterMetrics
from services.router.snapshots import SnapshotWriter, load_snapshot
from services.router.sync import KvSync
from shared.kv_stream import ensure_kv_stream
from shared.messages import WorkerCard
from shared.registry import WorkerRegistration, jetstream, open_kv, open_object_store
from shared.registry.jetstream import retry_transient, wait_replicated
from shared.registry.layout import models_store, workers_bucket
from shared.subjects import Subjects

NOT_CLUSTERED = "replicas > 1 not supported in non-clustered mode"


class FakeKv:
    """A bucket that keeps what is put in it."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.values: dict[str, bytes] = {}

    async def put(self, key: str, value: bytes) -> int:
        self.values[key] = value
        return len(self.values)

    async def delete(self, key: str, last: int | None = None) -> bool:
        return self.values.pop(key, None) is not None


class FakeObjectStore:
    """An empty store."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def get(self, name: str) -> Any:
        raise ObjectNotFoundError


class FakeJetStream:
    """Streams by name; KV buckets and object stores are streams ``KV_<b>`` / ``OBJ_<b>``."""

    def __init__(self, *, max_replicas: int = 3) -> None:
        self.streams: dict[str, StreamConfig] = {}
        self.max_replicas = max_replicas
        """More is refused as a single server refuses anything over 1."""
        self.updates: list[tuple[str, int | None]] = []
        self.create_races: set[str] = set()
        """Names another service creates (at R1) just before our create reaches the server."""
        self.lagging: set[str] = set()
        """Streams whose followers never catch up."""
        self.unanswered = 0
        """How many of the next lookups go unanswered (nats-py's request timeout)."""

    def _check(self, config: StreamConfig) -> None:
        if (config.num_replicas or 1) > self.max_replicas:
            raise ServerError(code=500, err_code=10074, description=NOT_CLUSTERED)

    def _info(self, name: str) -> StreamInfo:
        state = StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
        config = self.streams[name]
        followers = [
            PeerInfo(name=f"n{i}", current=name not in self.lagging, offline=False)
            for i in range(2, (config.num_replicas or 1) + 1)
        ]
        cluster = ClusterInfo(leader="n1", replicas=followers)
        return StreamInfo(config=config, state=state, cluster=cluster)

    async def stream_info(self, name: str) -> StreamInfo:
        if name not in self.streams:
            raise NotFoundError(code=404, err_code=10059, description="stream not found")
        return self._info(name)

    async def add_stream(self, config: StreamConfig) -> StreamInfo:
        assert config.name is not None
        if config.name in self.create_races:
            self.streams[config.name] = config.evolve(num_replicas=1)
        if config.name in self.streams:
            if self.streams[config.name] != config:
                raise BadRequestError(code=400, err_code=10058, description="name in use")
            return self._info(config.name)
        self._check(config)
        self.streams[config.name] = config
        return self._info(config.name)

    async def update_stream(self, config: StreamConfig) -> StreamInfo:
        assert config.name is not None
        self._check(config)
        self.updates.append((config.name, config.num_replicas))
        self.streams[config.name] = config
        return self._info(config.name)

    async def key_value(self, bucket: str) -> FakeKv:
        if self.unanswered:
            self.unanswered -= 1
            raise nats.errors.TimeoutError
        if f"KV_{bucket}" not in self.streams:
            raise BucketNotFoundError
        return FakeKv(bucket)

    async def create_key_value(self, config: Any) -> FakeKv:
        await self.add_stream(
            StreamConfig(name=f"KV_{config.bucket}", num_replicas=config.replicas)
        )
        return FakeKv(config.bucket)

    async def object_store(self, bucket: str) -> FakeObjectStore:
        if f"OBJ_{bucket}" not in self.streams:
            raise BucketNotFoundError
        return FakeObjectStore(bucket)

    async def create_object_store(self, bucket: str, config: Any) -> FakeObjectStore:
        await self.add_stream(StreamConfig(name=f"OBJ_{bucket}", num_replicas=config.replicas))
        return FakeObjectStore(bucket)

    def replicas(self, name: str) -> int:
        return self.streams[name].num_replicas or 1


def fake(**kwargs: Any) -> Any:
    """A ``FakeJetStream`` typed as what the helpers take."""
    return FakeJetStream(**kwargs)


SUBJECTS = Subjects("t")


class TestOpenKv:
    async def test_creates_a_missing_bucket_with_the_replicas_asked(self) -> None:
        js = fake()
        await open_kv(js, "b", 10.0, replicas=3)
        assert js.replicas("KV_b") == 3

    async def test_scales_an_existing_bucket_up(self) -> None:
        js = fake()
        await open_kv(js, "b", 10.0)  # a reader came first
        await open_kv(js, "b", 10.0, replicas=3)
        assert (js.replicas("KV_b"), js.updates) == (3, [("KV_b", 3)])

    @pytest.mark.parametrize("asked", [1, 2])
    async def test_never_scales_down(self, asked: int) -> None:
        js = fake()
        await open_kv(js, "b", 10.0, replicas=3)
        await open_kv(js, "b", 10.0, replicas=asked)
        assert (js.replicas("KV_b"), js.updates) == (3, [])

    async def test_a_refused_raise_is_a_warning_and_the_bucket_still_opens(self) -> None:
        js = fake(max_replicas=1)
        await open_kv(js, "b", 10.0)
        with capture_logs() as logs:
            kv = await open_kv(js, "b", 10.0, replicas=3)
        warning = [e for e in logs if e["event"] == "jetstream_replicas_not_raised"]
        assert (kv.bucket, js.replicas("KV_b"), warning[0]["error"]) == ("b", 1, NOT_CLUSTERED)

    async def test_after_a_lost_create_race_the_winners_bucket_is_scaled_up(self) -> None:
        js = fake()
        js.create_races.add("KV_b")
        kv = await open_kv(js, "b", 10.0, replicas=3)
        assert (kv.bucket, js.replicas("KV_b")) == ("b", 3)

    async def test_a_refused_create_raises_the_servers_reason(self) -> None:
        with pytest.raises(ServerError, match="non-clustered"):
            await open_kv(fake(max_replicas=1), "b", 10.0, replicas=3)


class TestRetryTransient:
    @pytest.fixture(autouse=True)
    def quick_backoff(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(jetstream, "OPEN_BACKOFF_S", (0.01,))

    async def test_an_unanswered_lookup_is_asked_again(self) -> None:
        js = fake()
        await open_kv(js, "b", 10.0, replicas=3)
        js.unanswered = 2
        with capture_logs() as logs:
            kv = await open_kv(js, "b", 10.0, replicas=3)
        retries = [e["attempt"] for e in logs if e["event"] == "jetstream_retry"]
        assert (kv.bucket, js.unanswered, retries) == ("b", 0, [1, 2])

    async def test_with_no_budget_it_is_asked_once(self) -> None:
        js = fake()
        await open_kv(js, "b", 10.0)
        js.unanswered = 1
        with pytest.raises(nats.errors.TimeoutError):
            await open_kv(js, "b", 10.0, retry_s=0)
        assert js.unanswered == 0

    async def test_past_its_budget_the_last_error_is_raised(self) -> None:
        calls = 0

        async def unanswered() -> None:
            nonlocal calls
            calls += 1
            raise nats.errors.TimeoutError

        with pytest.raises(nats.errors.TimeoutError):
            await retry_transient(unanswered, "b", budget_s=0.1)
        assert 2 <= calls <= 12

    async def test_other_errors_are_not_retried(self) -> None:
        calls = 0

        async def refused() -> None:
            nonlocal calls
            calls += 1
            raise ServerError(code=500, err_code=10074, description=NOT_CLUSTERED)

        with pytest.raises(ServerError):
            await retry_transient(refused, "b")
        assert calls == 1


class TestWaitReplicated:
    async def test_returns_once_every_follower_is_current(self) -> None:
        js = fake()
        await open_kv(js, "b", 10.0, replicas=3)
        assert await wait_replicated(js, "KV_b", 3, timeout_s=1) is True

    async def test_gives_up_with_a_warning_when_followers_lag(self) -> None:
        js = fake()
        await open_kv(js, "b", 10.0, replicas=3)
        js.lagging.add("KV_b")
        with capture_logs() as logs:
            is_current = await wait_replicated(js, "KV_b", 3, timeout_s=0.3)
        assert (is_current, [e["current"] for e in logs]) == (False, [1])


class TestOpenObjectStore:
    async def test_creates_a_missing_store_with_the_replicas_asked(self) -> None:
        js = fake()
        await open_object_store(js, "m", replicas=3)
        assert js.replicas("OBJ_m") == 3

    async def test_scales_an_existing_store_up_but_never_down(self) -> None:
        js = fake()
        await open_object_store(js, "m")
        await open_object_store(js, "m", replicas=3)
        await open_object_store(js, "m")
        assert (js.replicas("OBJ_m"), js.updates) == (3, [("OBJ_m", 3)])


class TestEnsureKvStream:
    async def test_creates_the_stream_with_the_replicas_asked(self) -> None:
        js = fake()
        info = await ensure_kv_stream(js, SUBJECTS, replicas=3)
        assert info.config.num_replicas == 3

    async def test_a_default_caller_updates_limits_but_keeps_the_replicas(self) -> None:
        js = fake()
        await ensure_kv_stream(js, SUBJECTS, replicas=3)
        info = await ensure_kv_stream(js, SUBJECTS, max_age_s=60)  # a router left at 1
        assert (info.config.num_replicas, info.config.max_age) == (3, 60)

    async def test_an_existing_stream_is_scaled_up(self) -> None:
        js = fake()
        await ensure_kv_stream(js, SUBJECTS)
        info = await ensure_kv_stream(js, SUBJECTS, replicas=3)
        assert info.config.num_replicas == 3

    async def test_a_refused_raise_still_updates_the_limits(self) -> None:
        js = fake(max_replicas=1)
        await ensure_kv_stream(js, SUBJECTS)
        with capture_logs() as logs:
            info = await ensure_kv_stream(js, SUBJECTS, max_age_s=60, replicas=3)
        events = [e["event"] for e in logs]
        assert (info.config.num_replicas, info.config.max_age) == (1, 60)
        assert "jetstream_replicas_not_raised" in events

    async def test_a_refused_create_raises_the_servers_reason(self) -> None:
        with pytest.raises(ServerError, match="non-clustered"):
            await ensure_kv_stream(fake(max_replicas=1), SUBJECTS, replicas=3)


class TestWiring:
    async def test_registry_layout_passes_the_replicas(self) -> None:
        js = fake()
        await workers_bucket(js, SUBJECTS, 10.0, replicas=3)
        await models_store(js, SUBJECTS, replicas=3)
        assert [js.replicas(n) for n in sorted(js.streams)] == [3, 3]

    async def test_worker_registration_creates_the_workers_bucket_with_its_replicas(
        self,
    ) -> None:
        js = fake()
        registration = WorkerRegistration(
            js, SUBJECTS, WorkerCard(worker_id="w", model="m"), replicas=3
        )
        await registration.start()
        await registration.stop()
        assert js.replicas(f"KV_{SUBJECTS.workers_bucket}") == 3

    async def test_router_snapshot_store_and_lease_bucket_get_the_replicas(self) -> None:
        js = fake()
        await load_snapshot(js, SUBJECTS, replicas=3)
        writer = SnapshotWriter(
            js,
            SUBJECTS,
            KvSync(),
            RouterMetrics(),
            router_id="r",
            interval_s=0,
            lease_ttl_s=5,
            replicas=3,
        )
        await writer.start()
        assert {n: js.replicas(n) for n in js.streams} == {
            f"OBJ_{SUBJECTS.router_store}": 3,
            f"KV_{SUBJECTS.router_lease_bucket}": 3,
        }


class TestSetting:
    def test_every_service_reads_jetserve_js_replicas(self) -> None:
        got = {
            name: cls.from_cli([], environ={"JETSERVE_JS_REPLICAS": "3"}).js_replicas
            for name, cls in service_configs().items()
        }
        assert got == dict.fromkeys(service_configs(), 3)

    def test_the_flag_wins_and_defaults_to_one(self) -> None:
        cls = service_configs()["router"]
        flagged = cls.from_cli(["--js-replicas", "5"], environ={"JETSERVE_JS_REPLICAS": "3"})
        assert (cls.from_cli([], environ={}).js_replicas, flagged.js_replicas) == (1, 5)

    @pytest.mark.parametrize("bad", ["0", "6"])
    def test_out_of_range_is_a_usage_error(self, bad: str) -> None:
        with pytest.raises(SystemExit):
            service_configs()["mocker"].from_cli([], environ={"JETSERVE_JS_REPLICAS": bad})
