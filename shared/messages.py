"""Wire messages exchanged between services: the only place message shapes are defined.

Every bus message is a frozen msgspec Struct, MessagePack on the wire (``shared.codec``). The
class name travels as the ``type`` tag, so one decoder can read a union. Only add fields with
defaults; a breaking change gets a new class or a ``v2`` subject token. The per-request and
per-token messages (``Generate``, ``TokenBatch``, ``RouteDecision``, ``RequestPhase``) leave
fields at their default off the wire (``omit_defaults``): a field added for one feature (issue
24's ranks and phases) costs the others nothing, and a token batch is ~half the bytes.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Api = Literal["chat", "completion"]
FinishReason = Literal["stop", "length", "cancelled", "error"]
OutputFormat = Literal["openai", "text", "kserve", "anthropic", "responses"]
"""``openai``: chat / completions objects. ``anthropic``: Messages API objects and events.
``responses``: OpenAI Responses API objects and events. ``text`` / ``kserve``: gRPC."""
ModelKind = Literal["llm", "tensor", "embedding", "image", "video"]
WorkerRole = Literal["prefill", "decode", "both"]
WORKER_ROLES: tuple[WorkerRole, ...] = ("prefill", "decode", "both")
MigrationKind = Literal["new_request", "ongoing"]


class Message(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Base for every request-path message; ``request_id`` travels in the body."""

    request_id: str


class Guided(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the output must look like: vLLM's structured outputs (guided decoding) and the
    request's tools, as an engine needs them (decision 019).

    A real engine constrains sampling with ``json_schema`` / ``json_object``, and with the
    tool-call schema when ``tool_choice`` is ``required`` or a function name. The mocker, which
    samples nothing, writes output that satisfies them in the model's own syntax
    (``tool_syntax``), so the formatter's parsers see what a real model would produce.
    """

    json_schema: dict[str, Any] | None = None
    """``response_format: {"type": "json_schema"}``: the output is one JSON document valid
    against this schema."""
    json_object: bool = False
    """``response_format: {"type": "json_object"}``: the output is one JSON object."""
    tools: tuple[dict[str, Any], ...] = ()
    """The request's function definitions (``{"name", "description", "parameters"}``)."""
    tool_choice: str = "auto"
    """``auto``, ``required``, or the name of the function that must be called (``none``
    sends no tools)."""
    parallel_tool_calls: bool = True
    tool_syntax: str = ""
    """The model's tool-call syntax, named as its tool parser (``hermes``, ``llama3_json``,
    ``mistral``, ``qwen3_coder``)."""
    tool_turn: bool = True
    """Whether the conversation ends with the user (not a tool result): a simulated model
    answering ``auto`` calls a tool only then. Real engines ignore it."""
    thinking: bool = False
    """The model writes a reasoning block before its answer (thinking enabled)."""
    thinking_opened: bool = False
    """The prompt already opened the reasoning block (the template wrote ``<think>``): the
    output starts inside it."""
    reasoning_syntax: str = ""
    """The model's reasoning syntax, named as its reasoning parser (``qwen3``, ``deepseek_r1``);
    empty when the model will not reason (no parser, or thinking turned off)."""
    max_thinking_tokens: int | None = None
    """``nvext.max_thinking_tokens``: at most this many tokens inside the reasoning block."""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the engine needs to sample; resolved by the preprocessor (``max_tokens`` is final)."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end generation, the model's EOS ids included unless ``ignore_eos``."""
    n: int = 1
    """Independent sequences for this prompt; each ``TokenBatch`` names its ``choice``."""
    logprobs: int | None = None
    """Return the sampled token's log-probability and this many alternatives (``None``: no
    log-probabilities at all)."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    greedy: bool = False
    """``nvext.greed_sampling``: always the most likely token (temperature 0)."""
    guided: Guided | None = None


class KServeOutput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """For ``format="kserve"``: what the stream responses carry besides the text."""

    id: str = ""
    """The client's ``ModelInferRequest.id``, echoed in every response."""
    outputs: tuple[str, ...] = ()
    """The outputs the client asked for (empty = all)."""


class OutputOptions(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the formatter needs to shape the client's response."""

    stream: bool = False
    include_usage: bool = False
    """Streaming only: send a final chunk with ``usage`` (``stream_options.include_usage``)."""
    continuous_usage: bool = False
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    echo: bool = False
    n: int = 1
    extra_fields: tuple[str, ...] = ()
    """``nvext.extra_fields``: e.g. ``("worker_id",)`` adds ``nvext.worker_id`` to the response."""
    logprobs: int | None = None
    """Return log-probabilities (``None``: no) with this many ``top_logprobs`` per token."""
    tool_parser: str = ""
    """The tool parser for the model's output (empty: no tool calls are parsed)."""
    reasoning_parser: str = ""
    """The reasoning parser (empty: reasoning text stays content)."""
    reasoning_open: bool = False
    """The prompt already opened the reasoning block (a template that writes ``<think>``
    itself): the output starts inside it."""
    legacy_functions: bool = False
    """The chat request sent the deprecated ``functions``: a tool call is answered as OpenAI
    answers those, ``function_call`` (one call) and ``finish_reason: "function_call"``."""
    parallel_tool_calls: bool = True
    """``False`` (``parallel_tool_calls: false``, Anthropic ``disable_parallel_tool_use``): only
    the first tool call of a choice is answered, as vLLM's ``maybe_filter_parallel_tool_calls``
    (whatever the engine wrote; decision 028)."""
    response_fields: dict[str, Any] | None = None
    """``format="responses"``: the request parameters the ``response`` object repeats
    (``instructions``, ``tools``, ``temperature``…)."""
    annotations: tuple[str, ...] = ()
    """``nvext.annotations`` to answer as SSE ``event:`` frames (``request_id``,
    ``formatted_prompt``, ``token_ids``)."""
    format: OutputFormat = "openai"
    """``openai``: SSE frames or a JSON body. ``text``: plain UTF-8 text deltas, the finish
    reason and token counts on the last chunk (gRPC ``ModelInfer``). ``kserve``: gRPC-framed
    ``ModelStreamInferResponse`` messages, ready for the wire (gRPC ``ModelStreamInfer``;
    ``shared.kserve_wire``)."""
    kserve: KServeOutput | None = None
    """With ``format="kserve"``."""


class RoutingHints(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Per-request routing inputs (``nvext``, ``cache_salt``, tenant and worker headers)."""

    overlap_score_weight: float | None = None
    router_temperature: float | None = None
    cache_salt: str | None = None
    """``cache_salt`` or ``x-tenant-id``: changes the block-hash seed, so tenants never share."""
    lora_name: str | None = None
    allowed_worker_ids: tuple[str, ...] | None = None
    """``nvext.allowed_worker_ids``: only these workers are candidates (``None``: any live
    worker). None of them live is the same error as no live worker at all."""
    dp_rank: int | None = None
    """``nvext.dp_rank`` / ``x-dynamo-dp-rank``: the data-parallel rank of the (decode or
    aggregated) worker. A rank out of the worker's range is a 400 (``param`` names it)."""
    prefill_worker_id: str | None = None
    """``nvext.prefill_worker_id`` / ``x-dynamo-prefill-instance-id``: the prefill worker of a
    disaggregated request (a 400 if it is unknown or not a prefill worker, a 503 if dead)."""
    prefill_dp_rank: int | None = None
    """``nvext.prefill_dp_rank`` / ``x-dynamo-prefill-dp-rank``: the prefill worker's rank."""
    decode_worker_id_param: str | None = None
    """Where the decode pin (``Generate.worker_id``) came from, for error messages
    (``nvext.decode_worker_id``, ``nvext.backend_instance_id`` or a header); None = unpinned."""
    query_only: bool = False
    """``nvext.annotations: ["query_instance_id"]``: answer with the worker(s) and ranks the
    router would choose and the token ids (``RouteChoice``), without generating and without
    changing any router state."""
    # --- admission (issue 26; the gateway resolves and validates all of these) ---------------
    priority: float = 0.0
    """``nvext.agent_hints.priority`` / ``x-dynamo-request-priority``: seconds this request
    jumps ahead of its tier in the router queue (its queue deadline moves earlier by it;
    negative waits longer)."""
    strict_priority: int = 0
    """``nvext.agent_hints.strict_priority`` / ``x-dynamo-request-strict-priority``: the queue
    tier; a higher tier is always served first."""
    policy_class: str | None = None
    """The admission class (``--admission-config``): from the tenant or API key, or
    ``x-dynamo-meta-policy-class`` where allowed. ``None``: the default class."""
    tenant: str | None = None
    """Whose token budget the request spends (``x-tenant-id`` or the API key's tenant)."""
    session_id: str | None = None
    """``X-Dynamo-Session-ID`` (or an agent session header): the session's turns stay on one
    worker (router ``--session-affinity-ttl-s``)."""
    osl: int | None = None
    """``nvext.agent_hints.osl``: the expected output tokens (the router's decode-load estimate)."""
    speculative_prefill: bool = False
    """``nvext.agent_hints.speculative_prefill``: when this turn finishes, warm the next turn's
    prefix (prompt + answer) on the same worker."""


class Preprocess(Message, frozen=True):
    """Gateway -> preprocessor: a validated client request, before templating."""

    api: Api
    model: str
    reply_to: str
    created: int
    """Unix seconds, used in response objects (``created``)."""
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    """OpenAI ``tools`` as the chat template gets them (``None`` with ``tool_choice="none"``);
    what the engine must do with them is ``sampling.guided``."""
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    max_tokens: int | None = None
    """As the client asked; ``None`` means up to the context length."""
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    output: OutputOptions = msgspec.field(default_factory=OutputOptions)
    deadline_ms: int = 0
    """Unix milliseconds after which the gateway has given up; 0 = none."""
    routing: RoutingHints | None = None
    worker_id: str | None = None
    """Pin a worker (``nvext.backend_instance_id`` or the ``x-worker-instance-id`` header)."""
    use_raw_prompt: bool = False
    """``nvext.use_raw_prompt``: tokenize without the chat template. Chat: the messages' text
    contents joined with newlines, as they are; completions: the prompt (never templated)."""


class StreamOpen(Message, frozen=True):
    """Preprocessor -> formatter (request/reply): get ready to format one request."""

    api: Api
    model: str
    reply_to: str
    created: int
    prompt_tokens: int
    output: OutputOptions
    max_tokens: int
    prompt_text: str = ""
    """Only for ``echo``."""
    annotations: tuple[tuple[str, str], ...] = ()
    """``(name, JSON text)`` per ``output.annotations`` entry, in order: what the client asked
    to see of its request (``request_id``, ``formatted_prompt``, ``token_ids``)."""
    tools: tuple[dict[str, Any], ...] = ()
    """The function definitions, when ``output.tool_parser`` is set: a parser may need their
    parameter schemas to type what it reads (``qwen3_coder``)."""
    generate: Generate | None = None
    """The request as the routers get it, kept by the formatter to migrate it (decision 017);
    ``None`` = no migration."""
    migration_limit: int = 0
    """How many times the formatter may route this request again after its worker is lost."""
    migration_max_seq_len: int = 0
    """No migration once prompt + generated tokens exceed this (0 = no such limit)."""
    base_model: str = ""
    """The model whose tokenizer decodes this request, when ``model`` (what answers name) is a
    LoRA adapter's id (decision 031); empty: ``model``."""


class StreamOpened(Message, frozen=True):
    """Formatter -> preprocessor: send the token batches of this request here."""

    stream_to: str
    formatter_id: str = ""
    """The answering instance; it also takes ``StreamOpen`` on ``formatter_open_direct(id)``
    without replying (empty from formatters that predate decision 013)."""


class ImageInput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One image of a prompt (decision 032): where its placeholder tokens are and its bytes."""

    mm_hash: str
    """sha256 of the image file's bytes, 64 hex digits: its identity in block hashes (the first
    16 digits as a u64, Dynamo's mapping of vLLM's hex ids) and vLLM's ``multi_modal_uuids``."""
    offset: int
    """Index in ``token_ids`` of the first of its placeholder (``<|image_pad|>``) tokens."""
    length: int
    """How many placeholder tokens it has (the model family's rule for its size)."""
    width: int
    height: int
    data: bytes = b""
    """The image file (PNG, JPEG, GIF or WebP) for engines that need its pixels (vLLM)."""


class Generate(Message, frozen=True, omit_defaults=True):
    """Preprocessor -> router -> worker: token ids ready for the engine."""

    model: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    stream_to: str
    """Where the worker sends ``TokenBatch`` and any hop sends ``RequestFailed``."""
    worker_id: str | None = None
    """Set by the router (or by a client pinning a worker)."""
    routing: RoutingHints | None = None
    resumed_tokens: int = 0
    """After a migration: how many trailing ``token_ids`` were generated by the worker that was
    lost. Engines treat them as prompt; a simulated one keeps its output a function of the
    original request and the position (the mocker)."""
    reply_to: str = ""
    """The gateway's subject: a worker that finds the formatter gone fails the request there."""
    attempt: int = 0
    """0, then 1, 2… for each migration; the worker echoes it in its batches, so batches of an
    abandoned attempt are told apart (decision 017)."""
    block_hashes: tuple[int, ...] = ()
    """Sequence hashes of full blocks of ``hash_block_size`` tokens of a prefix of
    ``token_ids`` (the whole prompt as the preprocessor made it; ``routing``'s salt applied),
    hashed once upstream so the router need not (``shared.hashing``). Empty: not hashed."""
    hash_block_size: int = 0
    dp_rank: int = 0
    """Set by the router: the data-parallel rank of ``worker_id`` that runs the request."""
    prefill_to: str = ""
    """Disaggregated serving, prefill phase (router -> prefill worker): compute the prompt's KV
    and one token, keep the blocks pinned for the decode worker, and answer ``PrefillResult``
    (or ``RequestFailed``) here instead of streaming to ``stream_to``."""
    kv_transfer: KvTransfer | None = None
    """Disaggregated serving, decode phase (router -> decode worker): where to pull the prompt's
    KV from. The decode worker pulls what it does not hold, then decodes and streams."""
    images: tuple[ImageInput, ...] = ()
    """The prompt's images, in prompt order (decision 032): their placeholder tokens are in
    ``token_ids`` already, expanded to each image's token count; their hashes are folded into
    the hashes of the blocks that hold those tokens."""


class KvTransfer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A prefill worker's handle on a prompt's KV blocks, pinned for the decode worker."""

    source_worker_id: str
    source_dp_rank: int = 0
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    """The engine's ``kv_transfer_params``, handed to the decode engine verbatim (vLLM: what
    its KV connector returned, e.g. NixlConnector's ``remote_block_ids``, ``remote_engine_id``,
    ``remote_host``, ``remote_port``; the mocker: its blocks and their size)."""
    expires_at: float = 0.0
    """Wall clock: the prefill worker frees the pinned blocks then, pulled or not."""
    cached_tokens: int = 0
    """Prompt tokens the prefill worker found in its prefix cache (set by the router from
    ``PrefillResult``): what the decode worker reports as cached, the pulled blocks being
    computed KV, not prefix-cache hits."""


class PrefillResult(Message, frozen=True):
    """Prefill worker -> the router that sent it (``Generate.prefill_to``): the prompt's KV is
    computed and pinned; ``kv_transfer`` says where to pull it from."""

    worker_id: str
    kv_transfer: KvTransfer
    dp_rank: int = 0
    token_ids: tuple[int, ...] = ()
    """The token the prefill produced (the decode worker computes its own first token, as a
    vLLM decode instance does)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0


class KvRelease(Message, frozen=True):
    """Decode worker -> prefill worker (``subjects.kv_release(source)``): the blocks of this
    request's ``KvTransfer`` were pulled (or will never be); unpin them."""

    pulled_blocks: int = 0


class RouteChoice(Message, frozen=True):
    """Router -> formatter, for a query-only request (``RoutingHints.query_only``): where the
    request would go, with its token ids. Nothing was generated and no router state changed."""

    worker_id: str
    dp_rank: int = 0
    prefill_worker_id: str = ""
    """Empty: aggregated (no prefill worker, or conditional disaggregation keeps it local)."""
    prefill_dp_rank: int = 0
    token_ids: tuple[int, ...] = ()
    overlap_blocks: int = 0
    prompt_tokens: int = 0


class TokenBatch(Message, frozen=True, omit_defaults=True):
    """Worker -> formatter: the next token ids of one request, in order."""

    token_ids: tuple[int, ...]
    index: int = 0
    """Position of the first id of this batch in the generated sequence (detects loss)."""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache; sent with the first batch."""
    worker_id: str = ""
    stop_token_id: int | None = None
    """With ``finish_reason="stop"``: the EOS / stop token id that ended generation, which is the
    last id of ``token_ids`` (counted in usage, never shown as text)."""
    attempt: int = 0
    """``Generate.attempt`` of the request this batch belongs to."""
    choice: int = 0
    """Which of the request's ``n`` sequences these tokens belong to (``index`` counts each
    sequence on its own)."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """With ``SamplingParams.logprobs``: one per id of ``token_ids``."""
    dp_rank: int = 0
    """The data-parallel rank of ``worker_id`` that produced the tokens."""
    prefill_worker_id: str = ""
    """Disaggregated: the worker that computed the prompt's KV (empty: ``worker_id`` did)."""
    prefill_dp_rank: int = 0


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """The sampled token's log-probability and the most likely alternatives ``(id, logprob)``,
    most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class RequestFailed(Message, frozen=True):
    """Any hop -> formatter or gateway: the request cannot go on."""

    code: str
    message: str
    status: int = 500
    retry_after_s: float | None = None
    param: str | None = None


class ResponseChunk(Message, frozen=True):
    """Formatter -> gateway: bytes ready for the client (SSE frames, or a whole JSON body)."""

    data: bytes
    done: bool = False
    prompt_tokens: int = 0
    """On the ``done`` chunk: the request's prompt tokens (for the gateway's access line)."""
    completion_tokens: int = 0
    """On the ``done`` chunk: the tokens generated."""
    finish_reason: str | None = None
    """On the ``done`` chunk: why generation ended."""
    seq: int = 0
    """Per request, from 0: every chunk the formatter sends is numbered, so the gateway sees a
    hole (a chunk lost in transit, e.g. while its NATS node changes) and asks for a replay
    (``StreamResume``, decision 018)."""


class Cancel(Message, frozen=True):
    """Broadcast: stop work on this request and free what it holds."""

    reason: str = "client_disconnected"
    worker_id: str | None = None
    """Only this worker's attempt (after a migration); ``None`` = wherever the request is."""


class WorkerLost(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Router -> formatters and peer routers (broadcast): a worker is gone (no responders to its
    probe, or unresponsive too long), with the requests that were in flight on it."""

    worker_id: str
    request_ids: tuple[str, ...] = ()
    reason: str = "no_responders"
    router_id: str = ""


class RouteQuery(Message, frozen=True):
    """Formatter -> routers (queue group, request/reply): which worker has this request?"""


class RouteStatus(Message, frozen=True):
    """Router -> formatter: the worker the request was routed to, ``None`` if no router knows
    it (it was lost before routing: a router died holding it)."""

    worker_id: str | None = None
    queued: bool = False
    """The request waits in a live router's queue: routed later, not lost."""


class StreamResume(Message, frozen=True):
    """Gateway -> every formatter and preprocessor (broadcast, request/reply, decision 018): who
    holds this request? The formatter holding it answers ``StreamHeld`` and sends its chunks from
    ``from_seq`` on to the request's reply subject again; a preprocessor preparing it answers
    ``StreamHeld`` too. Nobody answering means the request was lost in transit."""

    from_seq: int = 0


class StreamHeld(Message, frozen=True):
    """Answer to ``StreamResume``: ``holder`` is ``formatter`` or ``preprocessor``.

    From a formatter: ``first_seq`` is the oldest chunk it still holds (a replay from before it
    cannot be made: the stream has a hole) and ``next_seq`` the number of the next chunk."""

    holder: str
    first_seq: int = 0
    next_seq: int = 0


class WorkerPing(Message, frozen=True):
    """Formatter -> one worker, on its ping subject (request/reply, decision 018): do you still
    hold this attempt of the request? (A router's liveness probe sends an empty body.)"""

    attempt: int = 0


class WorkerPong(Message, frozen=True):
    """Worker -> formatter: whether it is generating ``WorkerPing``'s attempt of the request."""

    held: bool


class Migrated(Message, frozen=True):
    """Formatter -> bus (``jetserve tap``): one request routed again (decision 017)."""

    kind: MigrationKind
    from_worker: str
    reason: str
    attempt: int
    """1 for the first migration of this request."""
    generated_tokens: int = 0
    """Tokens appended to the prompt (generated before the worker was lost)."""
    formatter_id: str = ""


class FormatterLeaving(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Formatter -> preprocessors (broadcast): it is shutting down; stop direct opens to it."""

    formatter_id: str


class Tensor(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One named tensor, as KServe v2 ``InferInputTensor`` / ``InferOutputTensor`` with its
    contents in the raw form (``raw_input_contents``: row-major, little-endian; ``BYTES``
    elements each a 4-byte little-endian length, then the bytes)."""

    name: str
    datatype: str
    """KServe v2 datatype: ``BOOL``, ``UINT8`` … ``INT64``, ``FP16``, ``FP32``, ``FP64``,
    ``BF16``, ``BYTES``."""
    shape: tuple[int, ...]
    data: bytes = b""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class TensorInfer(Message, frozen=True):
    """Gateway -> tensor worker: a KServe v2 ``ModelInferRequest`` for a tensor model, as is."""

    model: str
    reply_to: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...] = ()
    """Requested output names; empty = every output."""
    model_version: str = ""
    id: str = ""
    """The client's ``ModelInferRequest.id``, echoed in the response."""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class TensorResult(Message, frozen=True):
    """Tensor worker -> gateway: the ``ModelInferResponse`` of one ``TensorInfer``."""

    model: str
    outputs: tuple[Tensor, ...]
    model_version: str = ""
    id: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


WorkerEvent = TokenBatch | RequestFailed | RouteChoice
"""What a formatter's stream subject carries (``RouteChoice``: a query-only answer)."""
PrefillAnswer = PrefillResult | RequestFailed
"""What a router's ``prefill_result`` subject carries."""
GatewayEvent = ResponseChunk | RequestFailed | TensorResult
"""What a gateway's reply subject carries."""


# --- durable records (JetStream KV / object store), not request-path messages ------------------


class LoraAdapter(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One LoRA adapter a worker holds: the model id clients name, its weights, its base."""

    name: str
    path: str
    parent: str = ""
    """The base model (``/v1/models``' ``parent``); empty: the worker's own model."""


class WorkerCard(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A live worker, as stored in the workers KV bucket under its ``worker_id``."""

    worker_id: str
    model: str
    kind: str = "mocker"
    block_size: int = 16
    kv_blocks: int = 0
    max_num_seqs: int = 0
    context_length: int = 0
    kv_events: bool = True
    """False: the engine publishes no KV events; routers estimate its cache (approximate mode)."""
    role: WorkerRole = "both"
    """``prefill``: computes prompts' KV for decode workers only; ``decode``: decodes requests
    whose KV a prefill worker computed (and prefills short ones itself under conditional
    disaggregation, or every one when no prefill worker lives); ``both``: aggregated."""
    dp_size: int = 1
    """Data-parallel ranks: the worker is ``dp_size`` routing targets ``(worker_id, rank)``,
    each with its own KV cache and load."""
    started_at: float = 0.0
    heartbeat_at: float = 0.0
    loras: tuple[LoraAdapter, ...] = ()
    """The LoRA adapters this worker holds (``--lora-modules``, or loaded at run time on
    ``worker_lora``): requests naming one may be routed here (decision 031)."""
    max_loras: int = 0
    """Adapters the engine keeps loaded at once (vLLM's ``--max-loras``); it swaps the others
    in on demand, least recently used out. 0: the engine serves no adapters."""


class ModelCard(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A served model, as stored in the models object store under ``<model>/card``."""

    model: str
    context_length: int
    eos_token_ids: tuple[int, ...] = ()
    files: tuple[str, ...] = ()
    """Names of the model files stored beside the card (``tokenizer.json``, ...)."""
    created: int = 0
    tool_parser: str = ""
    """The model's tool-call syntax, named as the formatter's tool parser (``hermes``,
    ``llama3_json``, ``mistral``, ``qwen3_coder``; empty: tool calls are not parsed)."""
    reasoning_parser: str = ""
    """The model's reasoning syntax, named as the formatter's reasoning parser (``qwen3``,
    ``deepseek_r1``; empty: reasoning stays content)."""
    kind: ModelKind = "llm"
    """``llm``: text in, tokens out (preprocessor, router, formatter). ``tensor``: KServe v2
    tensors straight to a worker (``TensorInfer``); ``tensor_spec`` describes them."""
    tensor_spec: TensorModelSpec | None = None
    kv_block_size: int = 0
    """Tokens per KV block of the model's workers (the first worker to register tells): the
    preprocessor hashes each prompt's blocks at this size for the router (0: it does not)."""
    vision: VisionSpec | None = None
    """The model takes images (decision 032): how many placeholder tokens one makes. ``None``:
    text only (an image part is a 400)."""


class VisionSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A vision-language model's image rule, Qwen2-VL style (its ``preprocessor_config.json``):
    an image is resized to multiples of ``patch_size * merge_size`` pixels within
    ``min_pixels``..``max_pixels`` and makes one token per merged patch."""

    image_token_id: int
    """The placeholder token the chat template renders once per image (``<|image_pad|>``)."""
    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 3136
    """Qwen2.5-VL's published ``preprocessor_config.json`` values (56 x 56 ...)."""
    max_pixels: int = 12845056
    """... and 28 x 28 x 16384."""


class TensorSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One input or output of a tensor model (KServe v2 ``TensorMetadata``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    """``-1`` for a variable dimension."""
    optional: bool = False


class TensorModelSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a tensor model takes and gives, as its worker registered it."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    platform: str = "jetserve"
    backend: str = "jetserve"
    triton_model_config: bytes = b""
    """A serialized Triton ``inference.ModelConfig``; when set, ``ModelConfig`` returns it
    verbatim and metadata comes from it."""


# --- KV cache events, load and routing decisions (issue 3: KV-aware routing) -------------------


class KvEvent(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True):
    """Base of the events inside a ``KvEventBatch``."""

    dp_rank: int = 0
    """The data-parallel rank whose cache changed (vLLM's ``data_parallel_rank``)."""


class BlockStored(KvEvent, frozen=True):
    """New full blocks, in prefix order. ``block_hashes`` are sequence hashes (whole prefix);
    ``parent_hash`` is the sequence hash of the block before the first one (None at the root);
    ``token_ids`` are the blocks' tokens (``len == len(block_hashes) * block_size``)."""

    block_hashes: tuple[int, ...]
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 16
    lora_name: str | None = None


class BlockRemoved(KvEvent, frozen=True):
    """Blocks evicted from the worker's cache (by sequence hash)."""

    block_hashes: tuple[int, ...]


class AllBlocksCleared(KvEvent, frozen=True):
    """The worker dropped its whole cache (reset, restart)."""


AnyKvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Worker -> JetStream ``<NS>_KV_EVENTS`` on ``<ns>.v1.kv.<worker_id>``.

    ``event_id`` counts batches per worker from 1 with no gaps; a router that sees a gap asks the
    worker for a full dump (``KvDump``).
    """

    worker_id: str
    event_id: int
    events: tuple[AnyKvEvent, ...]
    ts: float = 0.0


class KvDumpRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Router -> worker (request/reply on ``<ns>.v1.worker.<id>.kv_dump``)."""

    router_id: str = ""


class KvDump(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Worker -> router: every cached block as ``BlockStored`` events, as of ``event_id``."""

    worker_id: str
    event_id: int
    events: tuple[BlockStored, ...]


class WorkerLoad(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Worker -> routers on ``<ns>.v1.load.<worker_id>``, on change (rate-limited)."""

    worker_id: str
    active: int = 0
    waiting: int = 0
    kv_used_blocks: int = 0
    kv_total_blocks: int = 0
    prefill_tokens: int = 0
    ts: float = 0.0


class BusyThresholdsChanged(
    msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True
):
    """Gateway -> every router on ``<ns>.v1.router.busy_threshold`` (``POST /busy_threshold``),
    and the value stored under the model in the busy-thresholds KV bucket: one model's busy
    thresholds, replacing the routers' ``--active-*`` settings for it. All three ``None``: the
    model's entry was deleted, and the routers' settings apply again."""

    model: str
    active_decode_blocks_threshold: float | None = None
    """Busy when used KV blocks / total exceed this fraction (0..1)."""
    active_prefill_tokens_threshold: int | None = None
    """Busy when active prefill tokens exceed this count."""
    active_prefill_tokens_threshold_frac: float | None = None
    """Busy when active prefill tokens exceed this fraction of the worker's KV capacity in
    tokens (``kv_blocks * block_size``: the card has no max-batched-tokens figure)."""
    revision: int = 0
    """The bucket's revision of this value: a router keeps the highest per model, so a message
    and the bucket read at start may arrive in either order."""


class RequestPhase(Message, frozen=True, omit_defaults=True):
    """Worker -> routers on ``<ns>.v1.lifecycle.<worker_id>``: ``prefill_done`` or ``finished``."""

    worker_id: str
    phase: Literal["prefill_done", "finished"]
    ts: float = 0.0
    dp_rank: int = 0
    output_tokens: int = 0
    """With ``finished``: the tokens the request generated here (token budgets charge them)."""


class Candidate(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One routing target's score in a routing decision."""

    worker_id: str
    """The target: the worker id, with ``#<rank>`` for a data-parallel rank above 0
    (``shared.targets``)."""
    overlap_blocks: int = 0
    """Prompt blocks the worker need not prefill: cached there, or being computed there."""
    inflight_blocks: int = 0
    """Of ``overlap_blocks``, those only in flight: requests routed there earlier are computing
    them, not cached yet (the router's in-flight overlap; 0 with ``--no-inflight-overlap``)."""
    prefill_blocks: float = 0.0
    decode_blocks: float = 0.0
    cost: float = 0.0
    busy: bool = False


class RouteDecision(Message, frozen=True, omit_defaults=True):
    """Router -> peers and observers on ``<ns>.v1.decisions``: where a request went and why."""

    router_id: str
    worker_id: str
    model: str
    mode: str
    prompt_blocks: int = 0
    """``ceil(prompt tokens / block size)``: the KV blocks the request needs for its prompt."""
    overlap_blocks: int = 0
    prefill_tokens: int = 0
    """New (uncached) prompt tokens the chosen worker must prefill."""
    candidates: tuple[Candidate, ...] = ()
    ts: float = 0.0
    prompt_tokens: int = 0
    block_hashes: tuple[int, ...] = ()
    """Sequence hashes of the prompt's full blocks (kv modes), so peers can account the same
    shared-prefix load and, without KV events, the same assumed cache."""
    idle_workers: int = 0
    """Live workers not in ``candidates`` with nothing of the prompt cached and nothing in
    flight, each at ``idle_cost``. ``candidates`` lists every worker up to 32 of them; beyond,
    in kv mode at temperature 0 without busy thresholds (the defaults), the chosen one and the
    cheapest others, 4 in all."""
    idle_cost: float = 0.0
    unlisted_workers: int = 0
    """Live workers not in ``candidates`` with an overlap or requests in flight; none costs
    less than a listed one. (Round-robin and random beyond 32 workers list the chosen one
    only: every other worker is counted here.)"""
    dp_rank: int = 0
    """The rank of ``worker_id`` chosen (``worker_id`` is the decode worker when disaggregated)."""
    prefill_worker_id: str = ""
    """Disaggregated: the prefill worker (empty: ``worker_id`` prefills too)."""
    prefill_dp_rank: int = 0
    prefill_overlap_blocks: int = 0
    prefill_candidates: tuple[Candidate, ...] = ()
    disagg: str = ""
    """For a model with prefill workers: ``remote`` (prefill on ``prefill_worker_id``),
    ``local`` (conditional disaggregation kept the prefill on the decode worker) or
    ``fallback`` (no live prefill worker: aggregated on a decode worker). Empty otherwise."""
    policy_class: str = ""
    """The request's admission class (empty: the default class); its ``prefill_tokens`` are
    what the class was served (``--admission-config``)."""
    tenant: str = ""
    """Whose token budget the request spent (empty: none)."""
    queued_ms: float = 0.0
    """How long the request waited in the router queue before this decision."""
    output_blocks: int = 0
    """``ceil(agent_hints.osl / block size)``: the KV blocks its expected output will take,
    counted in its decode target's load from the start (Dynamo's expected output tokens)."""
    lora_name: str = ""
    """The LoRA adapter the request names (empty: the base model): every replica counts each
    adapter's requests in flight, which adapter placement reads (decision 031)."""


# --- LoRA adapters at run time (issue 27, decision 031) -----------------------------------------


class LoadLoraAdapter(Message, frozen=True):
    """Gateway or router -> one worker (request/reply on ``<ns>.v1.worker.<id>.lora``): hold
    this adapter (vLLM's ``/v1/load_lora_adapter`` body). Idempotent: an adapter already held
    under the same path is answered ``changed=False``. ``request_id`` names the command."""

    lora_name: str
    lora_path: str
    requested_by: str = ""
    """Who asked (a gateway, or the router replica placing adapters), for the worker's log."""


class UnloadLoraAdapter(Message, frozen=True):
    """Gateway or router -> one worker: stop holding this adapter (vLLM's
    ``/v1/unload_lora_adapter``). Requests already running on it finish; an adapter not held is
    answered ``changed=False`` (``found=False``)."""

    lora_name: str
    requested_by: str = ""


class LoraAdapterAnswer(Message, frozen=True, omit_defaults=True):
    """Worker -> the asker: what a ``LoadLoraAdapter`` / ``UnloadLoraAdapter`` did."""

    worker_id: str
    ok: bool = True
    changed: bool = False
    """The worker's adapters changed (its card is updated before this answer)."""
    found: bool = True
    """Unload: the adapter was held here."""
    code: str = ""
    """When not ``ok``: ``invalid_request`` (a bad name or path, another path under the same
    name), ``not_supported`` (an engine without adapters)."""
    message: str = ""
    loras: tuple[str, ...] = ()
    """The adapters the worker holds after the command."""


LoraCommand = LoadLoraAdapter | UnloadLoraAdapter
"""What a worker's ``lora`` subject carries."""


# --- admission (issue 26: the router queue's shared ledger) -------------------------------------


class AdmissionServed(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True):
    """Router -> the ``<NS>_ADMISSION`` stream, about every ``ledger_interval_s`` while it
    routes: what it admitted since its last record. Every replica sums every replica's records
    over the window, so classes' shares and tenants' budgets hold across replicas and restarts."""

    router_id: str
    ts: float
    """Wall clock at the end of the interval the record covers."""
    served: dict[str, int] = msgspec.field(default_factory=dict)
    """Policy class -> uncached prompt tokens routed (what fair shares count)."""
    spent: dict[str, int] = msgspec.field(default_factory=dict)
    """Tenant -> prompt tokens routed plus output tokens finished (what budgets count)."""


class AdmissionBacklog(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True):
    """Router -> peers (core NATS, also kept in the ``<NS>_ADMISSION`` stream for a starting
    replica), on change and every second while anything waits: the prompt tokens waiting in its
    queue. A class waiting at any replica takes its share; a router silent for a few seconds is
    gone, and so is its backlog."""

    router_id: str
    ts: float
    queued: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    """Model -> policy class -> prompt tokens waiting (a class waits for its model's workers)."""
    waiting: tuple[str, ...] = ()
    """The ids of the requests waiting there: any replica can tell a formatter asking about one
    that it is queued, not lost (``RouteStatus.queued``)."""


AdmissionRecord = AdmissionServed | AdmissionBacklog


# --- embeddings (issue 10: /v1/embeddings) -----------------------------------------------------


class Embed(Message, frozen=True):
    """Gateway -> preprocessors (queue group, request/reply on ``subjects.embed``): inputs to
    embed. Exactly one of ``texts`` / ``token_ids`` is non-empty; the answer (``EmbedResult``
    or ``RequestFailed``) goes to ``reply_to``."""

    model: str
    reply_to: str
    texts: tuple[str, ...] = ()
    token_ids: tuple[tuple[int, ...], ...] = ()
    """Pre-tokenized inputs, checked against the vocabulary by the preprocessor."""
    dimensions: int | None = None
    """Truncate each vector to this many dimensions, then renormalize (Matryoshka)."""
    deadline_ms: int = 0
    """Unix milliseconds after which nobody waits for the answer (0 = none)."""


class EmbedTokens(Message, frozen=True):
    """Preprocessor -> routers (queue group) -> one worker: tokenized inputs, one tuple each."""

    model: str
    reply_to: str
    token_ids: tuple[tuple[int, ...], ...]
    dimensions: int | None = None
    worker_id: str | None = None
    """Set by the router."""
    deadline_ms: int = 0


class EmbedResult(Message, frozen=True):
    """Embedding worker -> gateway: one vector per input, in input order."""

    model: str
    dimensions: int
    """Floats per vector."""
    vectors: bytes
    """Every vector's little-endian float32 values, one after the other (``count *
    dimensions * 4`` bytes): OpenAI's ``base64`` form needs exactly these bytes."""
    prompt_tokens: int
    worker_id: str = ""

    @property
    def count(self) -> int:
        """How many vectors ``vectors`` holds."""
        return len(self.vectors) // (4 * self.dimensions) if self.dimensions else 0


# --- token counting (issue 10: /v1/messages/count_tokens) --------------------------------------


class CountTokens(Message, frozen=True):
    """Gateway -> preprocessors (queue group, request/reply on ``subjects.count_tokens``): how
    many prompt tokens ``request`` makes, rendered and tokenized exactly as for generation.
    Answered with ``TokenCount`` or ``RequestFailed``."""

    request: Preprocess


class TokenCount(Message, frozen=True):
    """Preprocessor -> gateway: the answer to ``CountTokens``."""

    input_tokens: int


# --- media generation (issue 10: /v1/images/generations, /v1/videos/generations) ---------------

MediaKind = Literal["image", "video"]
MEDIA_KINDS: tuple[MediaKind, ...] = ("image", "video")


def media_worker_id(worker_id: str, kind: MediaKind) -> str:
    """The worker id a media worker registers a kind's model under (``<id>-image``)."""
    return f"{worker_id}-{kind}"


class MediaGenerate(Message, frozen=True):
    """Gateway -> one media worker (``subjects.media_generate(worker_id)``), request/reply:
    generate ``n`` images (PNG) or videos (animated PNG) for ``prompt``. Answered with
    ``MediaResult`` or ``RequestFailed`` on ``reply_to``."""

    model: str
    reply_to: str
    kind: MediaKind
    prompt: str
    width: int
    height: int
    n: int = 1
    seed: int | None = None
    """Same prompt, size, seed and index: the same bytes. ``None``: derived from the prompt."""
    negative_prompt: str = ""
    quality: str = ""
    style: str = ""
    num_frames: int = 0
    """Videos: frames to make (``seconds * fps`` when 0)."""
    fps: int = 0
    seconds: int = 0
    num_inference_steps: int = 0
    guidance_scale: float | None = None
    deadline_ms: int = 0
    """Wall-clock ms after which the worker drops the request (0 = none)."""


class MediaResult(Message, frozen=True):
    """Media worker -> gateway: the answer to ``MediaGenerate``, one encoded file per item."""

    model: str
    media_type: str
    """``image/png`` or ``image/apng``."""
    items: tuple[bytes, ...]
    revised_prompt: str = ""
    worker_id: str = ""
