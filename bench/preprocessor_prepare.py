"""Time the preprocessor's pure core (template + tokenize + resolve) with the Qwen3 tokenizer.

Run: ``.venv/bin/python bench/preprocessor_prepare.py`` (CPU only; no NATS).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from services.preprocessor import chat_template
from services.preprocessor.prepare import prepare, render_chat
from services.preprocessor.tokenizer import WANTED_FILES, ModelAssets, load_assets
from shared.messages import ModelCard, Preprocess
from shared.model_dir import context_length, ensure_default_model_dir, eos_token_ids

SHORT_CHAT = (
    {"role": "system", "content": "You are a helpful assistant. Answer briefly and accurately."},
    {
        "role": "user",
        "content": "What is the capital of France, and roughly how many people live there "
        "today? One line.",
    },
)
PROSE = Path(__file__).resolve().parents[1] / "docs" / "flow.md"


def _time_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1000


def _long_chat(assets: ModelAssets, tokens: int) -> tuple[dict[str, str], ...]:
    text = PROSE.read_text(encoding="utf-8")
    while len(assets.encode(text, add_special_tokens=False)) < tokens:
        text += "\n\n" + text
    ids = assets.encode(text, add_special_tokens=False)[:tokens]
    return ({"role": "user", "content": assets.decode(ids)},)


def main() -> None:
    model_dir = ensure_default_model_dir(Path(tempfile.mkdtemp()))
    card = ModelCard(
        model="Qwen/Qwen3-0.6B",
        context_length=context_length(model_dir),
        eos_token_ids=eos_token_ids(model_dir),
    )
    files = {name: (model_dir / name).read_bytes() for name in WANTED_FILES}
    started = time.perf_counter()
    assets = load_assets(card, files)
    print(f"load_assets: {(time.perf_counter() - started) * 1000:.0f} ms")
    for name, messages, repeat in (
        ("short chat", SHORT_CHAT, 2000),
        ("long chat", _long_chat(assets, 2880), 100),
    ):
        req = Preprocess(
            request_id="r", api="chat", model=card.model, reply_to="x", created=0, messages=messages
        )
        normalized = chat_template.normalize_messages(messages)
        text = render_chat(req, normalized, assets)
        tokens = prepare(req, assets).prompt_tokens
        render_ms = _time_ms(lambda: render_chat(req, normalized, assets), repeat)  # noqa: B023
        encode_ms = _time_ms(lambda: assets.encode(text, add_special_tokens=False), repeat)  # noqa: B023
        total_ms = _time_ms(lambda: prepare(req, assets), repeat)  # noqa: B023
        print(
            f"{name}: {tokens} tokens  render {render_ms:.3f} ms  encode {encode_ms:.3f} ms  "
            f"prepare {total_ms:.3f} ms"
        )


if __name__ == "__main__":
    main()
