"""LoRA adapters as workers are told about them: vLLM's ``--lora-modules`` syntax, parsed.

Pure. An item is ``name=path`` or vLLM's JSON form ``{"name": ..., "path": ...,
"base_model_name": ...}`` (vLLM's ``LoRAModulePath``, ``vllm/entrypoints/openai/serving_models.py``
and ``cli_args.py``); one setting value holds any number of items, separated by whitespace or
commas (``jetserve up --lora-modules a=/x b=/y`` joins vLLM's several arguments into one value).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["LoraModule", "check_adapter_name", "parse_lora_modules"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
"""What an adapter name may be: it is a model id clients send (no spaces, no ``=``)."""
_SEPARATORS = " \t\r\n,"


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One adapter: the name clients ask for, where its weights are, and (optionally) the base
    model it belongs to (vLLM's ``LoRAModulePath``)."""

    name: str
    path: str
    base_model_name: str | None = None


def check_adapter_name(name: str) -> str:
    """``name`` if it can be an adapter's model id; ``ValueError`` saying why not."""
    if not _NAME.match(name):
        raise ValueError(
            f"adapter name {name!r} must be 1-128 characters of letters, digits and . _ : / - "
            "(starting with a letter or digit)"
        )
    return name


def parse_lora_modules(text: str) -> tuple[LoraModule, ...]:
    """Every adapter in a ``--lora-modules`` value, in order; ``ValueError`` naming the bad item
    (an unknown JSON key, a missing path, a name given twice)."""
    modules: list[LoraModule] = []
    decoder = json.JSONDecoder()
    at = 0
    while True:
        while at < len(text) and text[at] in _SEPARATORS:
            at += 1
        if at >= len(text):
            break
        if text[at] == "{":
            try:
                raw, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--lora-modules: bad JSON item ({exc.msg})") from None
            modules.append(_from_json(raw))
            continue
        end = at
        while end < len(text) and text[end] not in _SEPARATORS:
            end += 1
        modules.append(_from_pair(text[at:end]))
        at = end
    seen: set[str] = set()
    for module in modules:
        if module.name in seen:
            raise ValueError(f"--lora-modules: adapter {module.name!r} is given twice")
        seen.add(module.name)
    return tuple(modules)


def _from_pair(item: str) -> LoraModule:
    name, sep, path = item.partition("=")
    if not sep or not name or not path:
        raise ValueError(
            f"--lora-modules: {item!r} is not name=path or a JSON object "
            '({"name": ..., "path": ..., "base_model_name": ...})'
        )
    return LoraModule(_checked(name), path)


def _from_json(raw: object) -> LoraModule:
    if not isinstance(raw, dict):
        raise ValueError("--lora-modules: a JSON item must be an object")
    unknown = sorted(set(raw) - {"name", "path", "base_model_name"})
    if unknown:
        raise ValueError(f"--lora-modules: unknown key(s) {', '.join(unknown)} in a JSON item")
    name, path, base = raw.get("name"), raw.get("path"), raw.get("base_model_name")
    if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
        raise ValueError('--lora-modules: a JSON item needs string "name" and "path"')
    if base is not None and not isinstance(base, str):
        raise ValueError('--lora-modules: "base_model_name" must be a string')
    return LoraModule(_checked(name), path, base or None)


def _checked(name: str) -> str:
    try:
        return check_adapter_name(name)
    except ValueError as exc:
        raise ValueError(f"--lora-modules: {exc}") from None
