"""JetServe ``SamplingParams`` → vLLM sampling arguments. Pure: no vllm import, no I/O.

Two shapes of the same decision:

- ``engine_kwargs``: keyword arguments of ``vllm.SamplingParams`` for the in-process engine
  (``vllm/sampling_params.py``, read at commit 00388f6573ccfcffad607b8c9ecdf341a4669ceb). Two
  values are plain Python here and made into vLLM objects by ``loader.make_sampling_params``:
  ``output_kind`` is the *name* of a ``RequestOutputKind`` member (``"DELTA"``) and
  ``structured_outputs`` is a dict of ``StructuredOutputsParams`` fields.
- ``completions_body``: the JSON body of a streaming ``POST /v1/completions`` to ``vllm serve``
  with a token-id prompt and ``return_token_ids`` (vLLM's ``CompletionRequest``,
  ``vllm/entrypoints/openai/serving_completion.py`` ``completion_stream_generator``).

Disaggregated serving (``phase``) asks vLLM exactly what its disaggregated serving proxy asks
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` ``send_request_to_service`` and
``_handle_completions``, read at commit 030ea52effcb05071543c8c42b8f0145e94cee43, the proxy of
``examples/online_serving/disaggregated_serving``'s NIXL setup): the prefill request gets
``max_tokens`` 1, no ``min_tokens`` ("not supported for P") and ``PREFILL_KV_TRANSFER_PARAMS``;
the decode request is the original with the prefill's ``kv_transfer_params`` verbatim (none when
the prefill returned none: the decode instance then prefills itself). Over HTTP they are the
request's ``kv_transfer_params`` field, and the prefill is not streamed (vLLM returns
``kv_transfer_params`` on the whole response only); in-process they go where vLLM's OpenAI server
puts that field, ``SamplingParams.extra_args["kv_transfer_params"]``
(``CompletionRequest.to_sampling_params``), which its scheduler hands the KV connector as
``Request.kv_transfer_params``. One choice only (``n`` 1): vLLM fans ``n`` out into child
requests, each of which would pull (or pin) the same blocks.

What vLLM cannot do as JetServe asks raises ``EngineError`` (a 400) with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shared.messages import Guided, SamplingParams
from shared.structural_tags import dumps, forces_tool_calls, structural_tag, tool_calls_format
from shared.worker.records import EngineError, EnginePhase

__all__ = [
    "OUTPUT_KIND_DELTA",
    "PREFILL_KV_TRANSFER_PARAMS",
    "SALT_PREFIX",
    "VllmFeatures",
    "cache_salt",
    "completions_body",
    "engine_kwargs",
    "features_for_version",
    "kv_transfer_params",
    "structured_outputs",
    "thinking_budget",
]

OUTPUT_KIND_DELTA = "DELTA"
"""``RequestOutputKind.DELTA``: each ``RequestOutput`` carries only the new tokens."""

SALT_PREFIX = "jetserve-seed-"
"""A request's ``cache_salt`` as vLLM sees it: this prefix and the hex of its JetServe hash seed.
vLLM puts the salt in the first block's extra keys (``BlockStored.extra_keys``), which is how
``kv_relay`` tells salted tenants' blocks apart."""


PREFILL_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""The ``kv_transfer_params`` of a prefill request, as vLLM's proxy sends them: the KV connector
keeps the prompt's blocks for a remote decode and returns how to pull them
(``NixlConnectorScheduler.request_finished``: ``do_remote_prefill``, ``remote_block_ids``,
``remote_engine_id``, ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``)."""


def kv_transfer_params(
    phase: EnginePhase, prefilled: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The request's ``kv_transfer_params`` in ``phase`` (None: none at all). A copy: vLLM's
    connector writes into the dict it gets (``do_remote_prefill`` = False once pulled)."""
    if phase == "prefill":
        return dict(PREFILL_KV_TRANSFER_PARAMS)
    if phase == "decode" and prefilled:
        return dict(prefilled)
    return None


def cache_salt(hash_seed: int, default_seed: int) -> str | None:
    """The ``cache_salt`` to give vLLM for a request (None when its seed is the LoRA's own:
    vLLM already separates LoRAs)."""
    if hash_seed == default_seed:
        return None
    return f"{SALT_PREFIX}{hash_seed:x}"


@dataclass(frozen=True, slots=True)
class VllmFeatures:
    """What the vLLM behind a worker can do for agent requests (``loader.features`` reads them
    from the installed vLLM; ``features_for_version`` from a remote server's ``/version``)."""

    tool_tags: bool = True
    """``StructuredOutputsParams.structural_tag`` with xgrammar's ``format`` tags (vLLM 0.11+,
    xgrammar 0.1.25+): ``tool_choice`` required or named."""
    thinking_budget: bool = True
    """``SamplingParams.thinking_token_budget`` (vLLM 0.20+): ``max_thinking_tokens``."""
    version: str = ""
    """The vLLM version, for error messages (empty: unknown)."""


ALL_FEATURES = VllmFeatures()
THINKING_BUDGET_SINCE = (0, 20)
TOOL_TAGS_SINCE = (0, 11)


def features_for_version(version: str | None) -> VllmFeatures:
    """What a vLLM of ``version`` (``GET /version``'s) can do; unknown: assume everything and
    let the server refuse what it cannot."""
    if not version:
        return ALL_FEATURES
    match = re.match(r"v?(\d+)\.(\d+)", version)
    if match is None:
        return VllmFeatures(version=version)
    release = (int(match[1]), int(match[2]))
    return VllmFeatures(
        tool_tags=release >= TOOL_TAGS_SINCE,
        thinking_budget=release >= THINKING_BUDGET_SINCE,
        version=version,
    )


def _too_old(what: str, since: tuple[int, int], features: VllmFeatures) -> EngineError:
    running = f"vLLM {features.version}" if features.version else "this vLLM"
    return EngineError(
        f"{what} needs vLLM {since[0]}.{since[1]} or newer; the worker runs {running}"
    )


def structured_outputs(
    guided: Guided | None, features: VllmFeatures = ALL_FEATURES
) -> dict[str, Any] | None:
    """``StructuredOutputsParams`` fields for ``guided`` (None: unconstrained).

    ``tool_choice`` required or named: a structural tag of the calls in the model's own syntax
    (``shared.structural_tags``), as vLLM's OpenAI server builds it; ``response_format`` is then
    dropped, as there. With a reasoning parser on the engine (``--reasoning-parser``), vLLM
    applies the constraint only after the reasoning block (``StructuredOutputsConfig.
    reasoning_parser``).
    """
    if guided is None:
        return None
    if forces_tool_calls(guided):
        if not features.tool_tags:
            raise _too_old(f"tool_choice={guided.tool_choice!r}", TOOL_TAGS_SINCE, features)
        try:
            calls = tool_calls_format(guided)
        except ValueError as exc:  # NoToolTag: a syntax without a tag (mistral)
            raise EngineError(f"{exc} (vLLM worker)") from None
        tag = structural_tag([calls])
        return {"structural_tag": dumps(tag)} if tag is not None else None
    if guided.json_schema is not None:
        return {"json": guided.json_schema}
    if guided.json_object:
        return {"json_object": True}
    return None


def thinking_budget(guided: Guided | None, features: VllmFeatures = ALL_FEATURES) -> int | None:
    """``thinking_token_budget`` for ``max_thinking_tokens`` (None: no budget). A model with no
    reasoning syntax writes no reasoning block, so its budget holds without one (vLLM would
    refuse a budget on an engine without a reasoning parser)."""
    if guided is None or guided.max_thinking_tokens is None or not guided.reasoning_syntax:
        return None
    if not features.thinking_budget:
        raise _too_old("max_thinking_tokens", THINKING_BUDGET_SINCE, features)
    return max(0, guided.max_thinking_tokens)


def _check(sampling: SamplingParams, phase: EnginePhase = "both") -> None:
    if sampling.n < 1:
        raise EngineError("n must be at least 1")
    if phase != "both" and sampling.n > 1:
        raise EngineError(
            f"n > 1 cannot run disaggregated on vLLM ({phase} phase): vLLM runs each choice as "
            "its own request, and each would pull the same prefilled blocks"
        )
    if sampling.max_tokens < 1:
        raise EngineError("max_tokens must be at least 1")
    if sampling.logprobs is not None and sampling.logprobs < 0:
        raise EngineError("logprobs must be at least 0 for the vLLM worker")


def _common(sampling: SamplingParams) -> dict[str, Any]:
    """The fields both shapes spell the same way."""
    out: dict[str, Any] = {
        "n": sampling.n,
        "max_tokens": sampling.max_tokens,
        "min_tokens": sampling.min_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": 1.0 if sampling.greedy else sampling.top_p,
        # JetServe's "all tokens" is -1; vLLM takes 0 (and, before 0.9, -1) for it.
        "top_k": 0 if sampling.greedy or sampling.top_k <= 0 else sampling.top_k,
        "min_p": 0.0 if sampling.greedy else sampling.min_p,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "repetition_penalty": sampling.repetition_penalty,
        "ignore_eos": sampling.ignore_eos,
        "stop_token_ids": list(sampling.stop_token_ids),
    }
    if sampling.seed is not None:
        out["seed"] = sampling.seed
    if sampling.logprobs is not None:
        out["logprobs"] = sampling.logprobs
    return out


def _prefill_only(out: dict[str, Any], phase: EnginePhase) -> None:
    """A prefill request computes the prompt and one token (the proxy's ``max_tokens`` 1; its
    ``min_tokens`` is dropped, as the proxy drops it)."""
    if phase == "prefill":
        out["max_tokens"] = 1
        out.pop("min_tokens", None)


def engine_kwargs(
    sampling: SamplingParams,
    *,
    phase: EnginePhase = "both",
    kv_transfer: dict[str, Any] | None = None,
    features: VllmFeatures = ALL_FEATURES,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (see the module docstring); ``kv_transfer``:
    a decode phase's ``EngineInput.kv_transfer_params``; ``features``: what the installed vLLM
    can do (``EngineError`` for what a request needs and it lacks)."""
    _check(sampling, phase)
    out = _common(sampling)
    _prefill_only(out, phase)
    params = kv_transfer_params(phase, kv_transfer)
    if params is not None:
        out["extra_args"] = {"kv_transfer_params": params}
    if sampling.logit_bias:
        out["logit_bias"] = {int(k): float(v) for k, v in sampling.logit_bias.items()}
    structured = structured_outputs(sampling.guided, features)
    if structured is not None:
        out["structured_outputs"] = structured
    budget = thinking_budget(sampling.guided, features)
    if budget is not None:
        out["thinking_token_budget"] = budget
    out["output_kind"] = OUTPUT_KIND_DELTA
    out["detokenize"] = False  # JetServe detokenizes in the formatter
    out["skip_special_tokens"] = False
    return out


def completions_body(
    token_ids: tuple[int, ...],
    sampling: SamplingParams,
    *,
    model: str,
    salt: str | None = None,
    phase: EnginePhase = "both",
    kv_transfer: dict[str, Any] | None = None,
    features: VllmFeatures = ALL_FEATURES,
) -> dict[str, Any]:
    """The JSON body of a streaming token-in/token-out ``/v1/completions`` request (a prefill
    phase's is not streamed: see the module docstring).

    ``return_token_ids`` puts each delta's ids in ``choices[i].token_ids``;
    ``return_tokens_as_token_ids`` names log-probability alternatives ``token_id:<id>``;
    ``stream_options.include_usage`` ends the stream with the usage chunk
    (``prompt_tokens_details.cached_tokens`` when the server runs with
    ``--enable-prompt-tokens-details``).
    """
    _check(sampling, phase)
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(token_ids),
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "echo": False,
        "skip_special_tokens": False,
        **_common(sampling),
    }
    if sampling.logit_bias:
        body["logit_bias"] = {str(k): float(v) for k, v in sampling.logit_bias.items()}
    if sampling.logprobs is not None:
        body["return_tokens_as_token_ids"] = True
    structured = structured_outputs(sampling.guided, features)
    if structured is not None:
        body["structured_outputs"] = structured
    budget = thinking_budget(sampling.guided, features)
    if budget is not None:
        body["thinking_token_budget"] = budget
    if salt is not None:
        body["cache_salt"] = salt
    _prefill_only(body, phase)
    if phase == "prefill":
        body["stream"] = False  # kv_transfer_params come back on a whole response only
        del body["stream_options"]  # vLLM refuses stream_options without stream
    params = kv_transfer_params(phase, kv_transfer)
    if params is not None:
        body["kv_transfer_params"] = params
    return body
