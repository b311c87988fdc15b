"""``output.format == "kserve"``: gRPC-framed ``ModelStreamInferResponse`` messages, the same text
as the ``text`` format, the finish reason and token counts on the last one."""

from __future__ import annotations

from typing import Any

from services.formatter.request import RequestFormatter
from services.formatter.shapers import KServeShaper, shaper_for
from shared.messages import KServeOutput, TokenBatch
from tests.unit.formatter.test_text_format import batches, run, stream_open, token_count
from tests.unit.shared.test_kserve_wire import parsed


def kserve_formatter(tokenizer: Any, **output: Any) -> RequestFormatter:
    kserve = KServeOutput(id="req-7", outputs=output.pop("outputs", ()))
    return RequestFormatter(
        stream_open("completion", format="kserve", kserve=kserve, **output), tokenizer, now=0
    )


def texts_of(data: bytes) -> list[tuple[bytes, str | None, bool]]:
    """(text_output, finish_reason, triton_final_response) of each message in ``data``."""
    out = []
    for message in parsed(data):
        response = message.infer_response
        assert (response.model_name, response.id) == ("Qwen/Qwen3-0.6B", "req-7")
        values = dict(
            zip(
                [o.name for o in response.outputs],
                [raw[4:] for raw in response.raw_output_contents],
                strict=True,
            )
        )
        finish = values.get("finish_reason")
        final = response.parameters["triton_final_response"].bool_param
        out.append((values.get("text_output", b""), finish and finish.decode(), final))
    return out


def test_shaper_for_the_kserve_format() -> None:
    assert isinstance(shaper_for(stream_open(format="kserve")), KServeShaper)


def test_each_batch_is_one_delta_and_the_finish_a_last_message(tokenizer: Any) -> None:
    fmt = kserve_formatter(tokenizer, stream=True)
    out = run(fmt, batches(tokenizer, ["Hello", " wörld"], finish="length"))
    assert [texts_of(data) for data in out] == [
        [(b"Hello", None, False)],
        [(" wörld".encode(), None, False), (b"", "length", True)],
    ]


def test_the_last_message_carries_the_token_counts(tokenizer: Any) -> None:
    fmt = kserve_formatter(tokenizer, stream=True)
    texts = ["Hello", " world"]
    last = parsed(run(fmt, batches(tokenizer, texts))[-1])[-1].infer_response
    counts = {k: v.int64_param for k, v in last.parameters.items() if k.endswith("_tokens")}
    assert counts == {"prompt_tokens": 11, "completion_tokens": token_count(tokenizer, texts)}


def test_a_batch_without_visible_text_sends_nothing(tokenizer: Any) -> None:
    fmt = kserve_formatter(tokenizer, stream=True)
    emoji = tokenizer.encode("🦜", add_special_tokens=False).ids
    first = fmt.on_batch(TokenBatch(request_id="r1", token_ids=(emoji[0],)), now=0.0)
    assert first == b""


def test_only_the_requested_outputs(tokenizer: Any) -> None:
    fmt = kserve_formatter(tokenizer, stream=True, outputs=("finish_reason",))
    out = run(fmt, batches(tokenizer, ["Hello", " world"], finish="stop"))
    assert [texts_of(data) for data in out] == [[], [(b"", "stop", True)]]


def test_not_streaming_is_one_last_message_with_the_whole_text(tokenizer: Any) -> None:
    fmt = kserve_formatter(tokenizer)
    out = run(fmt, batches(tokenizer, ["Hello", " world"], finish="stop"))
    assert [texts_of(data) for data in out] == [[], [(b"Hello world", "stop", True)]]


def test_the_text_equals_the_text_formats(tokenizer: Any) -> None:
    texts = ["Go go", " ST", "OP now", " more"]
    kserve = kserve_formatter(tokenizer, stream=True, stop=("STOP",))
    joined = b"".join(
        t for data in run(kserve, batches(tokenizer, texts)) for t, _, _ in texts_of(data)
    )
    text = RequestFormatter(
        stream_open(format="text", stream=True, stop=("STOP",)), tokenizer, now=0
    )
    assert joined == b"".join(run(text, batches(tokenizer, texts)))
