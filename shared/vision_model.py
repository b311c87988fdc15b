"""A vision-language model's image rule from its directory, and the bundled mock one (decision
032).

``vision_spec`` reads what a Qwen2-VL-family model directory says about images (its
``preprocessor_config.json`` and ``config.json``): a worker puts it on the model's card, and the
preprocessor expands each image's placeholder by it. ``ensure_vision_model_dir`` writes a
weightless vision model directory for the mocker (``jetserve up --vision-workers N``): the
bundled Qwen3 tokenizer, which has Qwen's vision tokens (``<|vision_start|>`` 151652,
``<|vision_end|>`` 151653, ``<|image_pad|>`` 151655, the ids Qwen2.5-VL uses), the VL chat
template below, Qwen2.5-VL-3B-Instruct's published ``config.json`` shapes and its
``preprocessor_config.json`` image rule.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from shared.messages import VisionSpec
from shared.model_dir import TOKENIZER_FILES, tokenizer_source, user_cache_dir

VISION_MODEL_NAME = "Qwen/Qwen2.5-VL-3B-Instruct"
IMAGE_PAD = "<|image_pad|>"
PREPROCESSOR_CONFIG = "preprocessor_config.json"

QWEN_VL_CHAT_TEMPLATE = """\
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'image' or part.type == 'image_url' -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set system_first = messages[0].role in ('system', 'developer') -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if system_first -%}
        {{- render_content(messages[0].content) -}}
    {%- else -%}
        {{- 'You are a helpful assistant.' -}}
    {%- endif -%}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
        'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and '
        'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif not system_first -%}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role in ('system', 'developer') -%}
        {%- if not (loop.first and tools) -%}
            {{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' + render_content(message.content) -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": '
                + (fn.arguments | tojson) + '}\\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""
"""Qwen2-VL's prompt format, written here: a message's content is a string or a list of parts;
each image part renders ``<|vision_start|><|image_pad|><|vision_end|>`` (the preprocessor then
expands the one ``<|image_pad|>`` to the image's token count); tools as Qwen's hermes format."""

QWEN2_5_VL_3B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128000,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}
"""Qwen2.5-VL-3B-Instruct's published ``config.json`` (the shapes the mocker reads)."""

QWEN2_5_VL_PREPROCESSOR: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
"""Qwen2.5-VL's published ``preprocessor_config.json``."""


def vision_model_dir() -> Path:
    """Where the mock vision model directory is written: ``<user cache>/qwen-vl-model``."""
    return user_cache_dir() / "qwen-vl-model"


def vision_spec(model_dir: Path) -> VisionSpec | None:
    """The image rule of the model at ``model_dir``; ``None`` for a text-only model (no
    ``preprocessor_config.json`` with a patch size, or no image token in ``config.json``)."""
    pre = _read_json(model_dir / PREPROCESSOR_CONFIG)
    config = _read_json(model_dir / "config.json")
    token = config.get("image_token_id")
    patch = pre.get("patch_size")
    if not isinstance(token, int) or not isinstance(patch, int):
        return None
    raw_size = pre.get("size")
    size: dict[str, Any] = raw_size if isinstance(raw_size, dict) else {}
    defaults = VisionSpec(image_token_id=token)
    # transformers writes min/max pixels as keys of their own or as size's shortest/longest edge
    min_pixels = pre.get("min_pixels") or size.get("shortest_edge") or defaults.min_pixels
    max_pixels = pre.get("max_pixels") or size.get("longest_edge") or defaults.max_pixels
    return VisionSpec(
        image_token_id=token,
        patch_size=patch,
        merge_size=int(pre.get("merge_size") or defaults.merge_size),
        min_pixels=int(min_pixels),
        max_pixels=int(max_pixels),
    )


def ensure_vision_model_dir(target: Path) -> Path:
    """Write the weightless mock vision model directory at ``target`` (idempotent)."""
    source = tokenizer_source()
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if name == "tokenizer_config.json":
            continue
        src, dst = source / name, target / name
        if src.is_file() and (not dst.is_file() or dst.stat().st_size != src.stat().st_size):
            shutil.copyfile(src, dst)
    tok_cfg = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {v["content"]: int(k) for k, v in tok_cfg.get("added_tokens_decoder", {}).items()}
    if ids.get(IMAGE_PAD) != QWEN2_5_VL_3B_CONFIG["image_token_id"]:
        raise ValueError(f"the bundled tokenizer has no {IMAGE_PAD} at the expected id")
    eos = ids[tok_cfg["eos_token"]]
    bos = ids.get("<|endoftext|>", eos)
    _write_json(
        target / "tokenizer_config.json", {**tok_cfg, "chat_template": QWEN_VL_CHAT_TEMPLATE}
    )
    _write_json(
        target / "config.json", {**QWEN2_5_VL_3B_CONFIG, "bos_token_id": bos, "eos_token_id": eos}
    )
    generation = {"bos_token_id": bos, "eos_token_id": [eos, bos], "pad_token_id": bos}
    _write_json(target / "generation_config.json", generation)
    _write_json(target / PREPROCESSOR_CONFIG, QWEN2_5_VL_PREPROCESSOR)
    return target


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
