"""NATS subject, stream, bucket and object-store names. Every subject string is built here."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

VERSION = "v1"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def is_token(value: str) -> bool:
    """True when ``value`` can be one subject token (no dots, spaces or wildcards)."""
    return bool(_TOKEN.match(value))


def check_token(value: str, what: str) -> str:
    """Return ``value`` or raise ValueError naming ``what`` when it is not a valid token."""
    if not is_token(value):
        raise ValueError(f"{what} must match {_TOKEN.pattern}: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subjects under one namespace; each test uses its own random namespace."""

    namespace: str = "jetserve"

    def __post_init__(self) -> None:
        check_token(self.namespace, "namespace")

    @property
    def _p(self) -> str:
        return f"{self.namespace}.{VERSION}"

    # --- request path (core NATS) -------------------------------------------------------------
    @property
    def preprocess(self) -> str:
        """Gateway -> preprocessors (queue group ``preprocessor``)."""
        return f"{self._p}.preprocess"

    @property
    def formatter_open(self) -> str:
        """Preprocessor -> formatters, request/reply ``StreamOpen`` (queue group ``formatter``)."""
        return f"{self._p}.formatter.open"

    def formatter_open_direct(self, formatter_id: str) -> str:
        """Preprocessor -> one formatter, fire-and-forget ``StreamOpen`` (decision 013)."""
        return f"{self._p}.formatter.{formatter_id}.open"

    def formatter_leaving(self, formatter_id: str) -> str:
        """Formatter -> every preprocessor: stop opening streams here directly (shutting down)."""
        return f"{self._p}.formatter.{formatter_id}.leaving"

    @property
    def formatter_leaving_all(self) -> str:
        return f"{self._p}.formatter.*.leaving"

    def stream(self, formatter_id: str, request_id: str) -> str:
        """Worker -> one formatter: token batches for one request."""
        return f"{self._p}.stream.{formatter_id}.{request_id}"

    def stream_all(self, formatter_id: str) -> str:
        """The one wildcard subscription of a formatter instance."""
        return f"{self._p}.stream.{formatter_id}.*"

    def formatter_of(self, stream_subject: str) -> str | None:
        """The formatter id in a ``stream(formatter_id, request_id)`` subject (else ``None``)."""
        head = f"{self._p}.stream."
        if not stream_subject.startswith(head):
            return None
        formatter_id, _, request_id = stream_subject[len(head) :].partition(".")
        return formatter_id if formatter_id and request_id else None

    def formatter_ping(self, formatter_id: str) -> str:
        """Worker -> one formatter, request/reply: are you there? ("no responders" = gone)."""
        return f"{self._p}.formatter.{formatter_id}.ping"

    @property
    def route(self) -> str:
        """Preprocessor -> routers (queue group ``router``): unrouted ``Generate``."""
        return f"{self._p}.router.generate"

    @property
    def route_status(self) -> str:
        """Formatter -> routers (queue group ``router``), request/reply: ``RouteQuery``."""
        return f"{self._p}.router.status"

    def generate(self, worker_id: str) -> str:
        """Router -> one worker."""
        return f"{self._p}.worker.{worker_id}.generate"

    def prefill_result(self, router_id: str) -> str:
        """Prefill worker -> the router that sent a prefill-phase ``Generate``
        (``Generate.prefill_to``): ``PrefillResult`` or ``RequestFailed``."""
        return f"{self._p}.router.{router_id}.prefilled"

    def kv_release(self, source_id: str) -> str:
        """Decode worker -> the prefill worker that pinned a request's blocks: ``KvRelease``."""
        return f"{self._p}.worker.{source_id}.kv_release"

    def worker_ping(self, worker_id: str) -> str:
        """Router -> one worker, request/reply: are you there? ("no responders" = gone).
        Formatter -> one worker: ``WorkerPing``, do you hold this request? (``WorkerPong``)."""
        return f"{self._p}.worker.{worker_id}.ping"

    @property
    def worker_lost(self) -> str:
        """Router -> formatters and peer routers (broadcast): ``WorkerLost``."""
        return f"{self._p}.worker_lost"

    @property
    def migrations(self) -> str:
        """Formatter -> bus: one ``Migrated`` per request routed again (for ``jetserve tap``)."""
        return f"{self._p}.migrations"

    def tensor_infer(self, worker_id: str) -> str:
        """Gateway -> one tensor worker: ``TensorInfer`` (tensor models skip the LLM stages)."""
        return f"{self._p}.worker.{worker_id}.tensor"

    def reply(self, gateway_id: str, request_id: str) -> str:
        """Formatter (or any failing hop) -> the gateway instance holding the client."""
        return f"{self._p}.gateway.{gateway_id}.{request_id}"

    def reply_all(self, gateway_id: str) -> str:
        """The one wildcard subscription of a gateway instance."""
        return f"{self._p}.gateway.{gateway_id}.*"

    def bounce(self, instance_id: str, request_id: str) -> str:
        """Reply subject a forwarding hop publishes with, to catch "no responders" itself."""
        return f"{self._p}.bounce.{instance_id}.{request_id}"

    def bounce_all(self, instance_id: str) -> str:
        return f"{self._p}.bounce.{instance_id}.*"

    @property
    def stream_resume(self) -> str:
        """Gateway -> every formatter and preprocessor (broadcast, request/reply):
        ``StreamResume``; the holder answers ``StreamHeld`` and replays (decision 018)."""
        return f"{self._p}.stream_resume"

    @property
    def cancel(self) -> str:
        """Broadcast ``Cancel``: every worker and formatter listens, the holder acts."""
        return f"{self._p}.cancel"

    # --- KV events, load, lifecycle, decisions (issue 3) --------------------------------------
    def kv_events(self, worker_id: str) -> str:
        """Worker -> the KV events stream (``kv_stream``)."""
        return f"{self._p}.kv.{worker_id}"

    @property
    def kv_events_all(self) -> str:
        return f"{self._p}.kv.*"

    @property
    def kv_stream(self) -> str:
        """JetStream stream of every worker's ``KvEventBatch``."""
        return f"{self.namespace.upper()}_KV_EVENTS"

    def kv_dump(self, worker_id: str) -> str:
        """Router -> one worker, request/reply: a full dump of its cached blocks."""
        return f"{self._p}.worker.{worker_id}.kv_dump"

    def worker_lora(self, worker_id: str) -> str:
        """Gateway or router -> one worker, request/reply: ``LoadLoraAdapter`` /
        ``UnloadLoraAdapter`` (answered ``LoraAdapterAnswer``)."""
        return f"{self._p}.worker.{worker_id}.lora"

    def load(self, worker_id: str) -> str:
        return f"{self._p}.load.{worker_id}"

    @property
    def load_all(self) -> str:
        return f"{self._p}.load.*"

    def lifecycle(self, worker_id: str) -> str:
        return f"{self._p}.lifecycle.{worker_id}"

    @property
    def lifecycle_all(self) -> str:
        return f"{self._p}.lifecycle.*"

    @property
    def busy_threshold(self) -> str:
        """Gateway -> every router (broadcast): ``BusyThresholdsChanged`` (``/busy_threshold``)."""
        return f"{self._p}.router.busy_threshold"

    @property
    def busy_thresholds_bucket(self) -> str:
        """KV bucket of each model's busy thresholds (``BusyThresholdsChanged``), keyed by
        ``busy_thresholds_key(model)``: what a router starting up applies."""
        return f"{self.namespace}_busy_thresholds"

    @property
    def decisions(self) -> str:
        """Every routing decision (peers apply them; ``jetserve tap`` shows them)."""
        return f"{self._p}.decisions"

    @property
    def router_store(self) -> str:
        """Object store of router index snapshots."""
        return f"{self.namespace}_router"

    @property
    def router_lease_bucket(self) -> str:
        """KV bucket holding the snapshot-writer lease."""
        return f"{self.namespace}_router_lease"

    # --- admission (issue 26) -------------------------------------------------------------------
    def admission_served(self, router_id: str) -> str:
        """Router -> ``admission_stream``: ``AdmissionServed`` records."""
        return f"{self._p}.admission.served.{router_id}"

    def admission_backlog(self, router_id: str) -> str:
        """Router -> ``admission_stream``: ``AdmissionBacklog`` (the last one per router kept)."""
        return f"{self._p}.admission.backlog.{router_id}"

    @property
    def admission_backlog_all(self) -> str:
        return f"{self._p}.admission.backlog.*"

    @property
    def admission_all(self) -> str:
        return f"{self._p}.admission.>"

    @property
    def admission_stream(self) -> str:
        """JetStream stream of the routers' admission ledger (served tokens, budgets, backlog)."""
        return f"{self.namespace.upper()}_ADMISSION"

    # --- durable state (JetStream) ------------------------------------------------------------
    @property
    def workers_bucket(self) -> str:
        """KV bucket of worker cards, keyed by worker id, kept alive by heartbeat."""
        return f"{self.namespace}_workers"

    @property
    def sessions_bucket(self) -> str:
        """KV bucket of session -> worker bindings (router ``--session-affinity-ttl-s``), kept
        by every router replica, expiring by max age (the session TTL)."""
        return f"{self.namespace}_sessions"

    @property
    def stored_turns_bucket(self) -> str:
        """KV bucket of stored Responses turns, keyed by response id (the gateway's
        ``--responses-store-*`` settings bound it), read by every gateway replica."""
        return f"{self.namespace}_responses"

    @property
    def models_store(self) -> str:
        """Object store of model cards and tokenizer files, ``<model>/<file>``."""
        return f"{self.namespace}_models"

    @property
    def model_uploads_bucket(self) -> str:
        """KV bucket of upload leases: one worker uploads a given file content, others wait."""
        return f"{self.namespace}_model_uploads"

    # --- embeddings (issue 10) ----------------------------------------------------------------
    @property
    def embed(self) -> str:
        """Gateway -> preprocessors (queue group ``preprocessor``), request/reply: ``Embed``."""
        return f"{self._p}.preprocess.embed"

    @property
    def embed_route(self) -> str:
        """Preprocessor -> routers (queue group ``router``): unrouted ``EmbedTokens``."""
        return f"{self._p}.router.embed"

    def embed_worker(self, worker_id: str) -> str:
        """Router -> one embedding worker: ``EmbedTokens``; it answers ``EmbedResult``."""
        return f"{self._p}.worker.{worker_id}.embed"

    # --- token counting (issue 10) ------------------------------------------------------------
    @property
    def count_tokens(self) -> str:
        """Gateway -> preprocessors (queue group ``preprocessor``), request/reply:
        ``CountTokens``, answered ``TokenCount``."""
        return f"{self._p}.preprocess.count_tokens"

    # --- media generation (issue 10) ---------------------------------------------------------
    def media_generate(self, worker_id: str) -> str:
        """Gateway -> one media worker, request/reply: ``MediaGenerate``, answered
        ``MediaResult`` (images and videos skip the LLM stages)."""
        return f"{self._p}.worker.{worker_id}.media"


def busy_thresholds_key(model: str) -> str:
    """A model's key in ``busy_thresholds_bucket``: its name in unpadded base64url (a KV key
    allows neither spaces nor every character a model name may hold)."""
    return base64.urlsafe_b64encode(model.encode()).decode().rstrip("=")


def request_id_of(subject: str) -> str:
    """The last token of a per-request subject (``stream`` / ``reply``)."""
    return subject.rpartition(".")[2]
