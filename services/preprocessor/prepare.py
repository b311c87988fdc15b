"""Pure core: a ``Preprocess`` request + the model's assets → token ids and resolved sampling.

Also builds the outgoing ``StreamOpen`` and ``Generate`` messages. Every expected failure is a
typed ``ServiceError``; nothing here logs or touches the bus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.preprocessor import chat_template, guided
from services.preprocessor.images import LoadedImage, expand_placeholders
from services.preprocessor.tokenizer import ModelAssets
from shared.errors import ContextLengthExceeded, InvalidRequest
from shared.hashing import prefix_hashes
from shared.images import mm_spans
from shared.messages import (
    Generate,
    ImageInput,
    OutputOptions,
    Preprocess,
    SamplingParams,
    StreamOpen,
)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request ready for the engine."""

    token_ids: tuple[int, ...]
    sampling: SamplingParams
    prompt_text: str = ""
    """The text to echo back (``output.echo`` only)."""
    output: OutputOptions = field(default_factory=OutputOptions)
    """The request's output options with the model's parsers resolved (``guided.resolve``)."""
    formatted_prompt: str = ""
    """The prompt text as the engine gets it, kept only for ``nvext.annotations``."""
    block_hashes: tuple[int, ...] = ()
    """The prompt's KV block hashes at ``assets.kv_block_size`` (``Generate.block_hashes``)."""
    hash_block_size: int = 0
    images: tuple[ImageInput, ...] = ()
    """The prompt's images, their placeholders expanded in ``token_ids`` (decision 032)."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)


def prepare(
    req: Preprocess,
    assets: ModelAssets,
    rendered: str | None = None,
    images: Sequence[LoadedImage] = (),
) -> Prepared:
    """Template, tokenize, check the context length and resolve sampling for one request.

    ``rendered``: the chat prompt ``rendered_chat`` already made for this request, if any.
    ``images``: the request's images, read (``image_fetch.ImageLoader``), in prompt order.
    """
    prompt_text: str | None = None
    inputs: tuple[ImageInput, ...] = ()
    if req.api == "chat" and req.prompt_token_ids is not None:  # nvext.token_data
        token_ids = check_token_ids(req.prompt_token_ids, assets.vocab_size)
        prompt_text = assets.decode(token_ids)
        echo = ""
    elif req.api == "chat":
        if rendered is None:
            rendered = rendered_chat(req, assets)
        prompt_text = rendered
        token_ids = tuple(assets.encode(rendered, add_special_tokens=False))
        if images and assets.vision is not None:
            token_ids, inputs = expand_placeholders(token_ids, images, assets.vision.image_token_id)
        echo = (
            _chat_echo(req, chat_template.normalize_messages(req.messages))
            if req.output.echo
            else ""
        )
    elif req.prompt_token_ids is not None:
        token_ids = check_token_ids(req.prompt_token_ids, assets.vocab_size)
        echo = assets.decode(token_ids) if req.output.echo else ""
    elif req.prompt is not None:
        prompt_text = req.prompt
        token_ids = tuple(assets.encode(req.prompt, add_special_tokens=True))
        echo = req.prompt if req.output.echo else ""
    else:
        raise InvalidRequest("a completion needs a prompt or prompt_token_ids", param="prompt")
    if not token_ids:
        raise InvalidRequest("the prompt cannot be empty", param=_prompt_param(req))
    max_tokens = resolve_max_tokens(req.max_tokens, len(token_ids), assets.context_length)
    if req.sampling.min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({req.sampling.min_tokens}) must be at most max_tokens ({max_tokens})",
            param="min_tokens",
        )
    stop_ids = resolve_stop_token_ids(
        req.sampling.stop_token_ids, assets.eos_token_ids, ignore_eos=req.sampling.ignore_eos
    )
    resolved, output = guided.resolve(req, assets, prompt_text)
    sampling = msgspec.structs.replace(
        req.sampling, max_tokens=max_tokens, stop_token_ids=stop_ids, guided=resolved
    )
    formatted = (prompt_text or "") if "formatted_prompt" in req.output.annotations else ""
    block_size = assets.kv_block_size
    hints = req.routing
    hashes = (
        prefix_hashes(
            token_ids,
            block_size,
            lora_name=hints.lora_name if hints else None,
            cache_salt=hints.cache_salt if hints else None,
            images=mm_spans(inputs),
        )
        if block_size > 0
        else ()
    )
    return Prepared(
        token_ids=token_ids,
        sampling=sampling,
        prompt_text=echo,
        output=output,
        formatted_prompt=formatted,
        block_hashes=tuple(hashes),
        hash_block_size=block_size if hashes else 0,
        images=inputs,
    )


def rendered_chat(req: Preprocess, assets: ModelAssets) -> str:
    """A chat request's prompt text, templated (for ``prepare(..., rendered=)``); with
    ``use_raw_prompt`` the messages' text contents as they are, one per line."""
    messages = chat_template.normalize_messages(req.messages)
    if req.use_raw_prompt:
        text = "\n".join(str(m["content"]) for m in messages if m.get("content"))
        if not text:
            raise InvalidRequest("use_raw_prompt needs message text", param="messages")
        return text
    return render_chat(req, messages, assets)


def render_chat(req: Preprocess, messages: Sequence[dict[str, Any]], assets: ModelAssets) -> str:
    """The prompt text of a chat request, rendered with the model's template."""
    if not messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    source = chat_template.select_template(assets.chat_templates, has_tools=bool(req.tools))
    return chat_template.render(
        source,
        messages,
        tools=req.tools,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        special_tokens=assets.special_tokens,
        template_kwargs=req.chat_template_kwargs,
    )


def resolve_max_tokens(requested: int | None, prompt_tokens: int, context_length: int) -> int:
    """The client's ``max_tokens``, or all the room left in the context (vLLM's default).

    Raises:
        InvalidRequest: ``requested`` < 1.
        ContextLengthExceeded: the prompt plus the completion do not fit.
    """
    if requested is not None and requested < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {requested}", param="max_tokens")
    # With no max_tokens, at least one completion token must fit.
    completion = requested if requested is not None else 1
    if prompt_tokens + completion > context_length:
        raise ContextLengthExceeded(
            limit=context_length, requested=prompt_tokens + completion, prompt_tokens=prompt_tokens
        )
    return requested if requested is not None else context_length - prompt_tokens


def resolve_stop_token_ids(
    client: Sequence[int], eos: Sequence[int], *, ignore_eos: bool
) -> tuple[int, ...]:
    """The client's stop ids, then the model's EOS ids unless ``ignore_eos``; no duplicates."""
    merged = [*client, *(() if ignore_eos else eos)]
    return tuple(dict.fromkeys(merged))


def check_token_ids(ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """``ids`` as given, or 400 when one is outside the vocabulary."""
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise InvalidRequest(f"token id {token_id} is out of vocabulary", param="prompt")
    return tuple(ids)


def stream_open(
    req: Preprocess, prepared: Prepared, *, migration_limit: int = 0, max_seq_len: int = 0
) -> StreamOpen:
    """What the formatter needs to shape this request's output (and, with a migration limit,
    to route it again: the ``Generate``, whose ``stream_to`` the formatter fills in).

    A request with ``n`` > 1 is never migrated: a migration resumes one sequence from the
    tokens the formatter saw (decision 017), while such a request has ``n`` sequences, each
    with its own generated tail, which one ``Generate`` with ``resumed_tokens`` cannot carry.
    """
    migratable = migration_limit > 0 and req.worker_id is None and prepared.sampling.n == 1
    lora = req.routing.lora_name if req.routing is not None else None
    return StreamOpen(
        request_id=req.request_id,
        api=req.api,
        model=lora or req.model,  # answers name the adapter asked for, as vLLM's do
        base_model=req.model if lora else "",
        reply_to=req.reply_to,
        created=req.created,
        prompt_tokens=prepared.prompt_tokens,
        output=prepared.output,
        max_tokens=prepared.sampling.max_tokens,
        prompt_text=prepared.prompt_text,
        tools=_parsed_tools(prepared),
        annotations=annotation_payloads(req, prepared),
        generate=generate(req, prepared, "") if migratable else None,
        migration_limit=migration_limit if migratable else 0,
        migration_max_seq_len=max_seq_len,
    )


def annotation_payloads(req: Preprocess, prepared: Prepared) -> tuple[tuple[str, str], ...]:
    """``StreamOpen.annotations``: each asked-for annotation's JSON payload (Dynamo's names)."""
    values: dict[str, Any] = {
        "request_id": req.request_id,
        "formatted_prompt": prepared.formatted_prompt,
        "token_ids": prepared.token_ids,
    }
    return tuple(
        (name, msgspec.json.encode(values[name]).decode())
        for name in req.output.annotations
        if name in values
    )


def _parsed_tools(prepared: Prepared) -> tuple[dict[str, Any], ...]:
    guided = prepared.sampling.guided
    if guided is None or not prepared.output.tool_parser:
        return ()
    return guided.tools


def generate(req: Preprocess, prepared: Prepared, stream_to: str) -> Generate:
    """The unrouted ``Generate`` for the routers."""
    return Generate(
        request_id=req.request_id,
        model=req.model,
        token_ids=prepared.token_ids,
        sampling=prepared.sampling,
        stream_to=stream_to,
        worker_id=req.worker_id,
        routing=req.routing,
        reply_to=req.reply_to,
        block_hashes=prepared.block_hashes,
        hash_block_size=prepared.hash_block_size,
        images=prepared.images,
    )


def prompt_chars(req: Preprocess) -> int:
    """A cheap size estimate of the text to tokenize (decides whether to leave the loop)."""
    if req.api == "completion":
        return len(req.prompt or "")
    total = 0
    for message in req.messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    return total


def _chat_echo(req: Preprocess, messages: Sequence[dict[str, Any]]) -> str:
    # vLLM echoes the last message when its role is the role of the reply.
    if not messages:
        return ""
    last = messages[-1]
    role = "assistant" if req.add_generation_prompt else last["role"]
    content = last["content"]
    if not isinstance(content, str):  # with images: its text parts
        content = "\n".join(p["text"] for p in content if p.get("type") == "text")
    return content if last["role"] == role else ""


def _prompt_param(req: Preprocess) -> str:
    return "messages" if req.api == "chat" else "prompt"
