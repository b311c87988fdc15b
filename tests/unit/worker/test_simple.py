"""``SimpleWorker``, the base of the workers with no engine, and what the three of them declare:
model cards first, then subscriptions, then (once the server has them) the worker cards; on the
way out the cards go before the subscriptions. Fakes stand in for nats-py and the registry: one
journal records what happened in which order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import nats.errors
import pytest
from structlog.testing import capture_logs

from services.echo_tensor.config import EchoTensorConfig
from services.echo_tensor.service import EchoTensorService
from services.embedder.config import EmbedderConfig
from services.embedder.service import EmbedderService
from services.media.config import MediaConfig
from services.media.service import MediaService
from shared.handlers import Callback
from shared.messages import ModelCard, WorkerCard
from shared.pings import answer_ping
from shared.subjects import Subjects
from shared.worker import presence as presence_module
from shared.worker import simple as simple_module
from shared.worker.simple import Model, SimpleWorker

Journal = list[tuple[str, ...]]


class _Sub:
    def __init__(self, journal: Journal, subject: str, *, is_gone: bool = False) -> None:
        self._journal = journal
        self.subject = subject
        self._is_gone = is_gone

    async def unsubscribe(self) -> None:
        if self._is_gone:
            raise nats.errors.ConnectionClosedError
        self._journal.append(("unsubscribe", self.subject))


class _Nats:
    """What ``SimpleWorker`` and ``WorkerPresence`` call on a nats-py client."""

    def __init__(self, journal: Journal, gone: frozenset[str] = frozenset()) -> None:
        self._journal = journal
        self._gone = gone

    def jetstream(self) -> object:
        return "js"

    async def subscribe(self, subject: str, cb: Callback) -> _Sub:
        self._journal.append(("subscribe", subject))
        return _Sub(self._journal, subject, is_gone=subject in self._gone)

    async def flush(self) -> None:
        self._journal.append(("flush",))


class _Registration:
    """Stands in for ``WorkerRegistration``: records its card's start and stop."""

    def __init__(
        self,
        journal: Journal,
        _js: object,
        _subjects: Subjects,
        card: WorkerCard,
        *,
        ttl_s: float,
        replicas: int,
    ) -> None:
        self._journal = journal
        self.card = card
        journal.append(("registration", card.worker_id, card.kind, str(ttl_s), str(replicas)))

    async def start(self) -> None:
        self._journal.append(("register", self.card.worker_id))

    async def stop(self) -> None:
        self._journal.append(("deregister", self.card.worker_id))


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> Journal:
    """The registry's writes, recorded instead of made."""
    seen: Journal = []

    async def publish_model_card(_js: object, _s: Subjects, card: ModelCard, **kw: Any) -> None:
        seen.append(("model_card", card.model, card.kind, str(kw["replicas"])))

    async def publish_model(
        _js: object, _s: Subjects, card: ModelCard, model_dir: Path, **kw: Any
    ) -> None:
        seen.append(("model", card.model, str(model_dir), str(kw["replicas"])))

    def registration(*args: Any, **kwargs: Any) -> _Registration:
        return _Registration(seen, *args, **kwargs)

    monkeypatch.setattr(simple_module, "publish_model_card", publish_model_card)
    monkeypatch.setattr(simple_module, "publish_model", publish_model)
    monkeypatch.setattr(presence_module, "WorkerRegistration", registration)
    return seen


@dataclass(frozen=True, slots=True, kw_only=True)
class _Config:
    SERVICE: ClassVar[str] = "toy"
    namespace: str = "t"
    js_replicas: int = 3
    worker_ttl_s: float = 6.0


async def _ignore(_: Any) -> None:
    return None


class _Toy(SimpleWorker[_Config]):
    """Two models (one with files), two worker cards, two subscriptions."""

    async def model_cards(self) -> Sequence[Model]:
        return [
            (ModelCard(model="a", context_length=0, kind="tensor"), None),
            (ModelCard(model="b", context_length=8), Path("/models/b")),
        ]

    def worker_cards(self) -> Sequence[WorkerCard]:
        return [WorkerCard(worker_id=w, model=w, kind="toy") for w in ("w1", "w2")]

    def subscriptions(self) -> Sequence[tuple[str, Callback]]:
        return [("t.one", _ignore), ("t.two", _ignore)]

    def log_fields(self) -> dict[str, object]:
        return {"worker_id": "w1"}


def _toy(journal: Journal, gone: frozenset[str] = frozenset()) -> _Toy:
    return _Toy(_Config(), _Nats(journal, gone))  # type: ignore[arg-type]


class TestSimpleWorker:
    async def test_publishes_models_subscribes_then_registers_once_the_server_has_them(
        self, journal: Journal
    ) -> None:
        await _toy(journal).start()
        assert journal == [
            ("model_card", "a", "tensor", "3"),
            ("model", "b", "/models/b", "3"),
            ("subscribe", "t.one"),
            ("subscribe", "t.two"),
            ("registration", "w1", "toy", "6.0", "3"),
            ("registration", "w2", "toy", "6.0", "3"),
            ("flush",),
            ("flush",),
            ("register", "w1"),
            ("register", "w2"),
        ]

    async def test_stop_leaves_the_registry_before_unsubscribing(self, journal: Journal) -> None:
        worker = _toy(journal)
        await worker.start()
        journal.clear()
        await worker.stop()
        assert journal == [
            ("deregister", "w1"),
            ("deregister", "w2"),
            ("unsubscribe", "t.one"),
            ("unsubscribe", "t.two"),
        ]

    async def test_a_subscription_the_connection_lost_is_skipped_on_stop(
        self, journal: Journal
    ) -> None:
        worker = _toy(journal, gone=frozenset({"t.one"}))
        await worker.start()
        journal.clear()
        await worker.stop()
        assert journal[-1:] == [("unsubscribe", "t.two")]

    async def test_logs_started_and_stopped_with_its_fields(self, journal: Journal) -> None:
        worker = _toy(journal)
        with capture_logs() as logs:
            await worker.start()
            await worker.stop()
        events = [(e["event"], e.get("worker_id")) for e in logs if e["event"].startswith("w")]
        assert events == [("worker_started", "w1"), ("worker_stopped", "w1")]

    def test_metrics_are_named_after_the_service(self, journal: Journal) -> None:
        assert _toy(journal).service_metrics.service == "toy"


# --- what the three workers declare --------------------------------------------------------------

SUBJECTS = Subjects("t")


def _echo(journal: Journal) -> EchoTensorService:
    config = EchoTensorConfig(namespace="t", worker_id="e1")
    return EchoTensorService(config, _Nats(journal))  # type: ignore[arg-type]


def _embedder(journal: Journal) -> EmbedderService:
    config = EmbedderConfig(namespace="t", worker_id="m1", model_name="emb")
    return EmbedderService(config, _Nats(journal))  # type: ignore[arg-type]


def _media(journal: Journal) -> MediaService:
    config = MediaConfig(namespace="t", worker_id="v1", image_model="img", video_model="vid")
    return MediaService(config, _Nats(journal))  # type: ignore[arg-type]


def _subjects_of(worker: SimpleWorker[Any]) -> list[str]:
    return [subject for subject, _ in worker.subscriptions()]


class TestEchoTensor:
    async def test_serves_a_tensor_card_alone_and_answers_no_pings(self, journal: Journal) -> None:
        echo = _echo(journal)
        await echo.start()
        assert journal[0] == ("model_card", "echo", "tensor", "1")
        assert _subjects_of(echo) == [SUBJECTS.tensor_infer("e1")]

    def test_its_worker_card_is_an_echo_tensor(self, journal: Journal) -> None:
        cards = [(c.worker_id, c.model, c.kind) for c in _echo(journal).worker_cards()]
        assert cards == [("e1", "echo", "echo_tensor")]

    def test_metrics_are_the_echo_tensor_s(self, journal: Journal) -> None:
        assert _echo(journal).service_metrics.service == "echo_tensor"


class TestEmbedder:
    def test_subscribes_embed_generate_and_ping(self, journal: Journal) -> None:
        embedder = _embedder(journal)
        assert _subjects_of(embedder) == [
            SUBJECTS.embed_worker("m1"),
            SUBJECTS.generate("m1"),
            SUBJECTS.worker_ping("m1"),
        ]
        assert embedder.subscriptions()[2][1] is answer_ping

    def test_its_worker_card_is_an_embedder(self, journal: Journal) -> None:
        cards = [(c.worker_id, c.model, c.kind) for c in _embedder(journal).worker_cards()]
        assert cards == [("m1", "emb", "embedder")]


class TestMedia:
    async def test_one_card_without_files_per_model(self, journal: Journal) -> None:
        await _media(journal).start()
        published = [entry for entry in journal if entry[0].startswith("model")]
        assert published == [
            ("model_card", "img", "image", "1"),
            ("model_card", "vid", "video", "1"),
        ]

    def test_each_model_has_a_worker_id_with_its_generate_and_ping(self, journal: Journal) -> None:
        assert _subjects_of(_media(journal)) == [
            SUBJECTS.media_generate("v1-image"),
            SUBJECTS.worker_ping("v1-image"),
            SUBJECTS.media_generate("v1-video"),
            SUBJECTS.worker_ping("v1-video"),
        ]

    def test_each_model_has_a_media_worker_card(self, journal: Journal) -> None:
        cards = [(c.worker_id, c.model, c.kind) for c in _media(journal).worker_cards()]
        assert cards == [("v1-image", "img", "media"), ("v1-video", "vid", "media")]
