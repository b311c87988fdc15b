"""Who publishes and who subscribes what on every subject: the one table of the bus.

``shared.subjects`` builds the names and ``shared.messages`` defines the shapes; this table says
who sends what where, how it is delivered and what is answered. ``shared.asyncapi`` turns it into
``docs/asyncapi.json``. Each entry names the ``Subjects`` member that builds its subject, so a
renamed member breaks this import, and a new one without an entry fails the tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from shared.messages import (
    AdmissionBacklog,
    AdmissionServed,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BusyThresholdsChanged,
    Cancel,
    CountTokens,
    Embed,
    EmbedResult,
    EmbedTokens,
    FormatterLeaving,
    Generate,
    KvDump,
    KvDumpRequest,
    KvEventBatch,
    KvRelease,
    LoadLoraAdapter,
    LoraAdapterAnswer,
    MediaGenerate,
    MediaResult,
    Migrated,
    ModelCard,
    PrefillResult,
    Preprocess,
    RequestFailed,
    RequestPhase,
    ResponseChunk,
    RouteChoice,
    RouteDecision,
    RouteQuery,
    RouteStatus,
    StreamHeld,
    StreamOpen,
    StreamOpened,
    StreamResume,
    TensorInfer,
    TensorResult,
    TokenBatch,
    TokenCount,
    UnloadLoraAdapter,
    WorkerCard,
    WorkerLoad,
    WorkerLost,
    WorkerPing,
    WorkerPong,
)
from shared.subjects import Subjects

SubjectRef = Callable[..., str] | property
"""A ``Subjects`` member, taken from the class: ``Subjects.generate``, ``Subjects.preprocess``."""
Transport = Literal["core", "jetstream", "kv", "object_store"]


@dataclass(frozen=True, slots=True)
class Opaque:
    """A payload that is no ``shared.messages`` Struct: an empty body, a server status, a file."""

    name: str
    summary: str
    content_type: str = "application/octet-stream"
    headers: tuple[tuple[str, str], ...] = ()
    """NATS headers it always carries (name, value)."""


Payload = type[msgspec.Struct] | Opaque


@dataclass(frozen=True, slots=True)
class Pub:
    """One service that publishes on a channel."""

    service: str
    messages: tuple[Payload, ...] = ()
    """The channel's messages this service sends (empty: all of them)."""
    note: str = ""


@dataclass(frozen=True, slots=True)
class Sub:
    """One service that subscribes to a channel."""

    service: str
    queue: str = ""
    """NATS queue group: one instance of the group gets each message ("": every instance)."""
    via: SubjectRef | None = None
    """The wildcard subject it subscribes with (one subscription per instance)."""
    note: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    """Request/reply: the subscriber answers on the requester's NATS inbox (``msg.reply``)."""

    messages: tuple[Payload, ...]
    note: str = ""


@dataclass(frozen=True, slots=True)
class AnswersOn:
    """Answers come later on another channel, at the subject a payload field names."""

    channel: str
    field: str
    messages: tuple[Payload, ...]


@dataclass(frozen=True, slots=True)
class Channel:
    """One subject (a pattern: its parameters are the member's arguments) and its traffic."""

    name: str
    subject: SubjectRef
    summary: str
    messages: tuple[Payload, ...]
    publishers: tuple[Pub, ...]
    subscribers: tuple[Sub, ...]
    description: str = ""
    reply: Reply | None = None
    answers_on: AnswersOn | None = None
    transport: Transport = "core"
    store: SubjectRef | None = None
    """The JetStream stream, KV bucket or object store behind the channel."""
    key: str = ""
    """KV / object store: the parameter naming the key (KV) or chunk (object store)."""


EMPTY = Opaque("Empty", "An empty body: answering at all is the answer.")
NO_RESPONDERS = Opaque(
    "NoResponders",
    "nats-server's status to a publisher whose message nobody received (empty body).",
    headers=(("Status", "503"),),
)
RAW_FILE = Opaque(
    "ModelFile",
    "A model file as is (tokenizer.json, tokenizer_config.json, config.json, "
    "generation_config.json), object <model>/<file>.",
)
ROUTER_SNAPSHOT = Opaque(
    "RouterSnapshot",
    "A router index snapshot (MessagePack IndexSnapshot of services/router/indexer.py), "
    "object kv-index, with the KV-event stream sequence it covers.",
    content_type="application/msgpack",
)
LEASE_HOLDER = Opaque("LeaseHolder", "The holding router's id (UTF-8).", "text/plain")
UPLOAD_LEASE = Opaque("UploadLease", "Empty: the key's creation is the lease.")
SESSION_BINDING = Opaque(
    "SessionBinding",
    "MessagePack StoredBinding of services/router/sessions.py: worker_id, dp_rank, router_id; "
    "the key is shared.sessions.session_key(model, session id).",
    content_type="application/msgpack",
)
STORED_TURN = Opaque(
    "StoredTurn",
    "JSON StoredTurn of services/gateway/apis/stored_turns.py: id, input (the turn's input "
    "items), response (as the client got it), ancestors (the stored turns before it), or "
    "omitted_bytes for a record over the limit.",
    content_type="application/json",
)

SERVICES: dict[str, str] = {
    "gateway": "HTTP (OpenAI, Anthropic) and gRPC (KServe v2) front end.",
    "preprocessor": "Chat template, tokenization, sampling resolution, stream handshake.",
    "router": "Picks a worker (KV-aware, round-robin, random, direct).",
    "formatter": "Detokenizes and shapes the client's response; migrates lost requests.",
    "mocker": "LLM worker (the simulated engine; any engine adapter speaks the same).",
    "echo_tensor": "KServe v2 tensor worker that returns its inputs.",
    "embedder": "Embedding worker (the simulated embedding model).",
    "media": "Image and video generation worker (the simulated diffusion model).",
    "nats-server": "The NATS server itself (status messages, JetStream storage).",
    "tap": "`jetserve tap SUBJECT`: prints every message as a JSON line, for debugging.",
}

PARAMETERS: dict[str, str] = {
    "namespace": "Deployment namespace (`--namespace`, `JETSERVE_NAMESPACE`; tests use a "
    "random one).",
    "worker_id": "A worker instance's id (its worker card's key).",
    "formatter_id": "A formatter instance's id.",
    "router_id": "A router instance's id (`--router-id`).",
    "source_id": "The id of the prefill worker that pinned a request's KV blocks.",
    "gateway_id": "A gateway instance's id.",
    "request_id": "The request's id (uuid4 hex or a valid client `X-Request-Id`).",
    "instance_id": "The id of the instance that forwarded the message (its bounce subject).",
    "chunk_id": "A chunk of a stored object (nats-server's NUID); read objects with the object "
    "store API (`nats object get`), not by subscribing.",
    "lease_key": "sha256 of `<object name>\\n<content digest>`.",
    "session_key": "sha256 of `<model>\\0<session id>` (hex, 40 characters).",
    "response_id": "A stored Responses turn's id (`resp_` and 32 hex digits).",
    "key": "The lease key (`snapshot-writer`).",
    "model_key": "A model's name in unpadded base64url (`shared.subjects.busy_thresholds_key`).",
}

_NS = "__namespace__"


def member_name(ref: SubjectRef) -> str:
    """The ``Subjects`` member's name (``generate``, ``preprocess``)."""
    fn = ref.fget if isinstance(ref, property) else ref
    return str(getattr(fn, "__name__", ""))


def address(ref: SubjectRef) -> str:
    """The subject pattern ``ref`` builds, parameters as ``{name}`` (``{namespace}.v1.…``);
    a name upper-cased by ``Subjects`` (the KV stream) shows as ``{NAMESPACE}``."""
    subjects = Subjects(_NS)
    if isinstance(ref, property):
        built = str(ref.__get__(subjects, Subjects))
    else:
        names = list(inspect.signature(ref).parameters)[1:]
        unknown = [n for n in names if n not in PARAMETERS]
        if unknown:
            raise ValueError(
                f"Subjects.{member_name(ref)} takes {unknown}: describe them in "
                "shared/bus_catalog.py PARAMETERS"
            )
        built = ref(subjects, *(f"__{n}__" for n in names))
    built = built.replace(_NS, "{namespace}").replace(_NS.upper(), "{NAMESPACE}")
    for name in PARAMETERS:
        built = built.replace(f"__{name}__", f"{{{name}}}")
    return built


def channel_address(channel: Channel) -> str:
    """Where the channel's messages travel: the subject, or the JetStream API subject of its
    KV bucket (``$KV.<bucket>.<key>``) or object store (``$O.<bucket>.C.<chunk>``)."""
    if channel.transport == "kv":
        return f"$KV.{address(channel.subject)}.{{{channel.key}}}"
    if channel.transport == "object_store":
        return f"$O.{address(channel.subject)}.C.{{{channel.key}}}"
    return address(channel.subject)


def inbox(channel: str) -> str:
    """The name of a request/reply channel's answer channel (the requester's inbox)."""
    return f"{channel}_inbox"


def referenced_members(channels: tuple[Channel, ...]) -> set[str]:
    """Every ``Subjects`` member the table names (subjects, wildcards, stores)."""
    refs: list[Any] = []
    for c in channels:
        refs += [c.subject, c.store, *(s.via for s in c.subscribers)]
    return {member_name(r) for r in refs if r is not None}


WORKER_EVENTS_REPLY = AnswersOn("stream", "stream_to", (TokenBatch, RequestFailed))
EMBED_ANSWERS = AnswersOn(inbox("embed"), "reply_to", (EmbedResult, RequestFailed))
"""The gateway's inbox of an ``Embed`` (the ``embed`` channel's reply channel)."""

CHANNELS: tuple[Channel, ...] = (
    Channel(
        name="preprocess",
        subject=Subjects.preprocess,
        summary="A validated client request, before templating.",
        messages=(Preprocess,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("preprocessor", queue="preprocessor"),),
        description="The NATS reply subject is the gateway's reply subject too, so a missing "
        "preprocessor is a 503 at once (no responders).",
        answers_on=AnswersOn("gateway_reply", "reply_to", (ResponseChunk, RequestFailed)),
    ),
    Channel(
        name="formatter_open",
        subject=Subjects.formatter_open,
        summary="Open a stream: a formatter gets ready to format one request.",
        messages=(StreamOpen,),
        publishers=(Pub("preprocessor"),),
        subscribers=(Sub("formatter", queue="formatter"),),
        reply=Reply(
            (StreamOpened, RequestFailed),
            "`StreamOpened.stream_to` is where the worker's token batches go.",
        ),
    ),
    Channel(
        name="formatter_open_direct",
        subject=Subjects.formatter_open_direct,
        summary="Open a stream on a formatter known from an earlier `StreamOpened` (decision "
        "013), without waiting for an answer.",
        messages=(StreamOpen,),
        publishers=(Pub("preprocessor"),),
        subscribers=(Sub("formatter"),),
        description="The NATS reply subject is the preprocessor's bounce subject: a formatter "
        "gone is a `NoResponders` there.",
    ),
    Channel(
        name="formatter_leaving",
        subject=Subjects.formatter_leaving,
        summary="A formatter is shutting down: stop opening streams on it directly.",
        messages=(FormatterLeaving,),
        publishers=(Pub("formatter"),),
        subscribers=(Sub("preprocessor", via=Subjects.formatter_leaving_all),),
    ),
    Channel(
        name="stream",
        subject=Subjects.stream,
        summary="Token batches of one request, to the formatter that opened its stream.",
        messages=(TokenBatch, RequestFailed, RouteChoice),
        publishers=(
            Pub("mocker", note="token batches, or the failure of its generation"),
            Pub(
                "router",
                (RequestFailed, RouteChoice),
                "no worker can take the request; the choice of a query-only request",
            ),
            Pub("preprocessor", (RequestFailed,), "no router answered"),
        ),
        subscribers=(Sub("formatter", via=Subjects.stream_all),),
        description="Workers publish with their bounce subject as NATS reply: a formatter gone "
        "is a `NoResponders` to the worker.",
    ),
    Channel(
        name="formatter_ping",
        subject=Subjects.formatter_ping,
        summary="Is this formatter there? (a worker whose batches bounced asks; no responders "
        "= gone).",
        messages=(EMPTY,),
        publishers=(Pub("mocker"),),
        subscribers=(Sub("formatter"),),
        reply=Reply((EMPTY,)),
    ),
    Channel(
        name="route",
        subject=Subjects.route,
        summary="An unrouted `Generate`: a router picks the worker.",
        messages=(Generate,),
        publishers=(
            Pub("preprocessor"),
            Pub(
                "formatter",
                note="a migration: the request again, with the tokens generated "
                "so far appended (decision 017)",
            ),
        ),
        subscribers=(Sub("router", queue="router"),),
        description="Published with the publisher's bounce subject as NATS reply.",
        answers_on=WORKER_EVENTS_REPLY,
    ),
    Channel(
        name="route_status",
        subject=Subjects.route_status,
        summary="Which worker has this request? (a formatter whose stream stalled asks).",
        messages=(RouteQuery,),
        publishers=(Pub("formatter"),),
        subscribers=(Sub("router", queue="router"),),
        reply=Reply((RouteStatus,)),
    ),
    Channel(
        name="generate",
        subject=Subjects.generate,
        summary="A routed request, to the worker the router chose.",
        messages=(Generate,),
        publishers=(Pub("router"),),
        subscribers=(
            Sub("mocker"),
            Sub("embedder", note="answers `RequestFailed` (400): use the embeddings API"),
        ),
        description="Published with the router's bounce subject as NATS reply: a worker gone "
        "since its last heartbeat bounces back and the router tries another one.",
        answers_on=WORKER_EVENTS_REPLY,
    ),
    Channel(
        name="prefill_result",
        subject=Subjects.prefill_result,
        summary="A prefill worker's answer to a prefill-phase `Generate`: the prompt's KV is "
        "pinned for the decode worker (`PrefillResult`), or the prefill failed.",
        messages=(PrefillResult, RequestFailed),
        publishers=(Pub("mocker"),),
        subscribers=(Sub("router"),),
        description="Disaggregated serving: the router that sent the prefill phase then sends the "
        "decode phase, with the result's `kv_transfer`, to the decode worker.",
    ),
    Channel(
        name="kv_release",
        subject=Subjects.kv_release,
        summary="A decode worker pulled a request's KV blocks (or never will): the prefill "
        "worker unpins them.",
        messages=(KvRelease,),
        publishers=(Pub("mocker"),),
        subscribers=(Sub("mocker"),),
    ),
    Channel(
        name="worker_ping",
        subject=Subjects.worker_ping,
        summary="Is this worker there (a router's probe, empty), does it still hold this "
        "request (a formatter's `WorkerPing`)?",
        messages=(WorkerPing, EMPTY),
        publishers=(Pub("router", (EMPTY,)), Pub("formatter", (WorkerPing,))),
        subscribers=(
            Sub("mocker"),
            Sub("embedder", note="holds no generation"),
            Sub("media", note="holds no generation"),
        ),
        reply=Reply((WorkerPong, EMPTY), "`WorkerPong` to a `WorkerPing`, empty to a probe."),
    ),
    Channel(
        name="worker_lost",
        subject=Subjects.worker_lost,
        summary="A worker is gone, with the requests that were in flight on it.",
        messages=(WorkerLost,),
        publishers=(Pub("router"),),
        subscribers=(Sub("formatter"), Sub("router", note="peer routers")),
    ),
    Channel(
        name="migrations",
        subject=Subjects.migrations,
        summary="One notice per request routed again after its worker was lost.",
        messages=(Migrated,),
        publishers=(Pub("formatter"),),
        subscribers=(Sub("tap"),),
    ),
    Channel(
        name="tensor_infer",
        subject=Subjects.tensor_infer,
        summary="A KServe v2 inference request for a tensor model (skips the LLM stages).",
        messages=(TensorInfer,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("echo_tensor"),),
        answers_on=AnswersOn("gateway_reply", "reply_to", (TensorResult, RequestFailed)),
    ),
    Channel(
        name="gateway_reply",
        subject=Subjects.reply,
        summary="What the gateway instance holding the client gets for one request.",
        messages=(ResponseChunk, RequestFailed, TensorResult),
        publishers=(
            Pub(
                "formatter",
                (ResponseChunk, RequestFailed),
                "response bytes, numbered by `seq`; replayed on `StreamResume`",
            ),
            Pub("preprocessor", (RequestFailed,)),
            Pub("mocker", (RequestFailed,), "its formatter is gone"),
            Pub("echo_tensor", (TensorResult, RequestFailed)),
        ),
        subscribers=(Sub("gateway", via=Subjects.reply_all),),
        description="The formatter publishes its chunks with its bounce subject as NATS reply: "
        "a gateway gone is a `NoResponders` to the formatter.",
    ),
    Channel(
        name="bounce",
        subject=Subjects.bounce,
        summary='nats-server\'s "no responders" to a message a hop forwarded with this '
        "reply subject (decision 002).",
        messages=(NO_RESPONDERS,),
        publishers=(Pub("nats-server"),),
        subscribers=tuple(
            Sub(s, via=Subjects.bounce_all)
            for s in ("preprocessor", "router", "formatter", "mocker")
        ),
        description="The status names the subject nobody received in its `Nats-Subject` header.",
    ),
    Channel(
        name="stream_resume",
        subject=Subjects.stream_resume,
        summary="Who holds this request? The gateway asks when chunks stop or a hole shows "
        "(decision 018).",
        messages=(StreamResume,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("formatter"), Sub("preprocessor")),
        reply=Reply(
            (StreamHeld,),
            "Only the holder answers; a formatter then sends its "
            "chunks from `from_seq` on to the request's `reply` subject again.",
        ),
    ),
    Channel(
        name="cancel",
        subject=Subjects.cancel,
        summary="Stop work on this request and free what it holds; the holder acts.",
        messages=(Cancel,),
        publishers=(
            Pub("gateway", note="client disconnected"),
            Pub("formatter", note="stop string, timeout, abandoned attempt"),
            Pub("preprocessor", note="a direct stream open bounced"),
        ),
        subscribers=(Sub("mocker"), Sub("formatter"), Sub("router")),
    ),
    Channel(
        name="kv_events",
        subject=Subjects.kv_events,
        summary="A worker's KV cache events, numbered per worker without gaps.",
        messages=(KvEventBatch,),
        publishers=(Pub("mocker", note="JetStream publish"),),
        subscribers=(
            Sub(
                "router",
                via=Subjects.kv_events_all,
                note="from its snapshot's sequence; a gap in `event_id` makes it ask for "
                "a `KvDump`",
            ),
        ),
        transport="jetstream",
        store=Subjects.kv_stream,
    ),
    Channel(
        name="kv_dump",
        subject=Subjects.kv_dump,
        summary="Every block a worker caches, to repair a router's view after an event gap.",
        messages=(KvDumpRequest,),
        publishers=(Pub("router"),),
        subscribers=(Sub("mocker"),),
        reply=Reply((KvDump,)),
    ),
    Channel(
        name="worker_lora",
        subject=Subjects.worker_lora,
        summary="Hold or drop a LoRA adapter (vLLM's load/unload_lora_adapter): the gateway's "
        "admin endpoints and the router replica that places adapters (decision 031).",
        messages=(LoadLoraAdapter, UnloadLoraAdapter),
        publishers=(
            Pub("gateway", note="`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`"),
            Pub("router", note="the placement lease holder only"),
        ),
        subscribers=(Sub("mocker"),),
        reply=Reply((LoraAdapterAnswer,)),
    ),
    Channel(
        name="load",
        subject=Subjects.load,
        summary="A worker's load, on change (rate-limited).",
        messages=(WorkerLoad,),
        publishers=(Pub("mocker"),),
        subscribers=(Sub("router", via=Subjects.load_all),),
    ),
    Channel(
        name="busy_threshold",
        subject=Subjects.busy_threshold,
        summary="One model's busy thresholds, set through the gateway's `POST /busy_threshold`: "
        "every router applies them at once.",
        messages=(BusyThresholdsChanged,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("router"),),
        description="Sent after the value is stored in the `busy_thresholds` bucket; `revision` "
        "(the bucket's) orders a message and a router's read of the bucket.",
    ),
    Channel(
        name="busy_thresholds",
        subject=Subjects.busy_thresholds_bucket,
        summary="Each model's busy thresholds (`POST /busy_threshold`), replacing the routers' "
        "`--active-*` settings for it; a router starting up applies them.",
        messages=(BusyThresholdsChanged,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("gateway", note="`GET /busy_threshold` reads it"), Sub("router")),
        description="A KV bucket keyed by the model's name in unpadded base64url; a deleted key "
        "(every threshold set to null) gives the model back the routers' settings.",
        transport="kv",
        key="model_key",
    ),
    Channel(
        name="lifecycle",
        subject=Subjects.lifecycle,
        summary="A request's prefill is done, or it finished, on a worker.",
        messages=(RequestPhase,),
        publishers=(Pub("mocker"), Pub("embedder", note="`finished` for a refused `Generate`")),
        subscribers=(Sub("router", via=Subjects.lifecycle_all),),
    ),
    Channel(
        name="decisions",
        subject=Subjects.decisions,
        summary="Every routing decision: where a request went and every candidate's cost (beyond "
        "32 workers, the chosen one and the cheapest others, 4 in all; the rest are counted in "
        "`idle_workers`, each at `idle_cost`, and `unlisted_workers`).",
        messages=(RouteDecision,),
        publishers=(Pub("router"),),
        subscribers=(Sub("router", note="peer routers apply them"), Sub("tap")),
    ),
    Channel(
        name="admission_served",
        subject=Subjects.admission_served,
        summary="What a router admitted in the last interval: uncached prompt tokens per policy "
        "class, prompt + output tokens per tenant (issue 26, decision 026).",
        messages=(AdmissionServed,),
        publishers=(Pub("router", note="every `--ledger-interval-s` while it routes"),),
        subscribers=(Sub("router", via=Subjects.admission_all, note="replayed at start"),),
        transport="jetstream",
        store=Subjects.admission_stream,
    ),
    Channel(
        name="admission_backlog",
        subject=Subjects.admission_backlog,
        summary="What waits in a router's queue: prompt tokens per model and class, and the "
        "waiting request ids (a class waiting anywhere takes its share; a formatter asking "
        "about a queued request hears `queued`).",
        messages=(AdmissionBacklog,),
        publishers=(
            Pub(
                "router", note="on change (at most every 50 ms), every second while anything waits"
            ),
        ),
        subscribers=(
            Sub(
                "router",
                via=Subjects.admission_backlog_all,
                note="peers, live; a starting router replays the stream",
            ),
        ),
        description="Core NATS, live; the `admission_served` channel's stream keeps these "
        "too (its subjects are `admission.>`), so a starting router replays the last ones.",
    ),
    Channel(
        name="embed",
        subject=Subjects.embed,
        summary="Inputs to embed (`/v1/embeddings`): the preprocessor tokenizes them.",
        messages=(Embed,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("preprocessor", queue="preprocessor"),),
        reply=Reply(
            (EmbedResult, RequestFailed),
            "The inbox is also the message's `reply_to`: the hop that ends the request answers "
            "there (the embedder's `EmbedResult`, or a `RequestFailed` from any hop).",
        ),
    ),
    Channel(
        name="embed_route",
        subject=Subjects.embed_route,
        summary="Tokenized inputs to embed: a router picks an embedding worker.",
        messages=(EmbedTokens,),
        publishers=(Pub("preprocessor"),),
        subscribers=(Sub("router", queue="router"),),
        description="Published with the preprocessor's bounce subject as NATS reply.",
        answers_on=EMBED_ANSWERS,
    ),
    Channel(
        name="embed_worker",
        subject=Subjects.embed_worker,
        summary="Tokenized inputs to embed, to the worker the router chose.",
        messages=(EmbedTokens,),
        publishers=(Pub("router"),),
        subscribers=(Sub("embedder"),),
        description="Published with the router's bounce subject as NATS reply: a worker gone "
        "bounces back and the router tries another one.",
        answers_on=EMBED_ANSWERS,
    ),
    Channel(
        name="count_tokens",
        subject=Subjects.count_tokens,
        summary="How many prompt tokens a request makes (`/v1/messages/count_tokens`), "
        "rendered and tokenized as for generation.",
        messages=(CountTokens,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("preprocessor", queue="preprocessor"),),
        reply=Reply((TokenCount, RequestFailed)),
    ),
    Channel(
        name="media_generate",
        subject=Subjects.media_generate,
        summary="Generate images or videos (`/v1/images/generations`, "
        "`/v1/videos/generations`) on the media worker the gateway picked (round-robin).",
        messages=(MediaGenerate,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("media"),),
        reply=Reply((MediaResult, RequestFailed)),
    ),
    Channel(
        name="workers",
        subject=Subjects.workers_bucket,
        summary="Worker cards, one per live worker, kept alive by heartbeat (max age = TTL).",
        messages=(WorkerCard,),
        publishers=(Pub("mocker"), Pub("echo_tensor"), Pub("embedder"), Pub("media")),
        subscribers=(
            Sub("gateway"),
            Sub("router"),
            Sub("preprocessor", note="loads a model's tokenizer when its first worker comes"),
            Sub("formatter", note="as the preprocessor"),
        ),
        description="A KV bucket: readers watch it (every key's latest value, then changes); a "
        "deleted key (SIGTERM) or an expired one is a worker gone.",
        transport="kv",
        key="worker_id",
    ),
    Channel(
        name="models",
        subject=Subjects.models_store,
        summary="Model cards and tokenizer files, uploaded by workers.",
        messages=(ModelCard, RAW_FILE),
        publishers=(
            Pub("mocker"),
            Pub("echo_tensor", (ModelCard,)),
            Pub("embedder"),
            Pub("media", (ModelCard,)),
        ),
        subscribers=(Sub("gateway"), Sub("preprocessor"), Sub("formatter")),
        description="An object store: object `<model>/card` is a `ModelCard`, the other "
        "objects of `<model>/` are its files.",
        transport="object_store",
        key="chunk_id",
    ),
    Channel(
        name="model_uploads",
        subject=Subjects.model_uploads_bucket,
        summary="Upload leases: of workers starting together, the one that creates the key "
        "uploads the file, the others wait for its digest.",
        messages=(UPLOAD_LEASE,),
        publishers=(Pub("mocker"), Pub("echo_tensor"), Pub("embedder"), Pub("media")),
        subscribers=(Sub("mocker"), Sub("echo_tensor"), Sub("embedder"), Sub("media")),
        transport="kv",
        key="lease_key",
    ),
    Channel(
        name="router_snapshots",
        subject=Subjects.router_store,
        summary="Router index snapshots; a new replica loads the newest and replays the KV "
        "events from the sequence it covers (decision 007).",
        messages=(ROUTER_SNAPSHOT,),
        publishers=(Pub("router", note="the lease holder"),),
        subscribers=(Sub("router"),),
        transport="object_store",
        key="chunk_id",
    ),
    Channel(
        name="router_lease",
        subject=Subjects.router_lease_bucket,
        summary="Which router replica writes snapshots.",
        messages=(LEASE_HOLDER,),
        publishers=(Pub("router"),),
        subscribers=(Sub("router"),),
        transport="kv",
        key="key",
    ),
    Channel(
        name="sessions",
        subject=Subjects.sessions_bucket,
        summary="Session affinity: which worker (and rank) each session's turns go to "
        "(router `--session-affinity-ttl-s`).",
        messages=(SESSION_BINDING,),
        publishers=(Pub("router"),),
        subscribers=(Sub("router"),),
        description="A KV bucket, max age = the session TTL: every router replica watches it "
        "into memory. A first turn's router creates the key (compare-and-set: racing routers "
        "agree on the winner); a binding moves (compare-and-set on its revision) only when "
        "its worker died or, in soft mode, is busy; a used binding is rewritten (its TTL "
        "restarted) at most every quarter TTL.",
        transport="kv",
        key="session_key",
    ),
    Channel(
        name="stored_turns",
        subject=Subjects.stored_turns_bucket,
        summary="Stored Responses turns (`store`, `previous_response_id`, `GET`/`DELETE "
        "/v1/responses/{id}`): any gateway replica continues any conversation.",
        messages=(STORED_TURN,),
        publishers=(Pub("gateway"),),
        subscribers=(Sub("gateway", note="reads a turn and the turns before it"),),
        description="A KV bucket keyed by response id, max age `--responses-store-ttl-s`, at "
        "most `--responses-store-max-bytes` (the oldest records go first when full); a record "
        "over `--responses-max-stored-bytes` is kept as a marker saying so (decision 030).",
        transport="kv",
        key="response_id",
    ),
)

EMBEDDED: tuple[type[msgspec.Struct], ...] = (BlockStored, BlockRemoved, AllBlocksCleared)
"""Tagged Structs that travel only inside other messages (``KvEventBatch``, ``KvDump``)."""
