"""The ``StreamOpen`` of a request that may migrate, for the unit tests of migration."""

from __future__ import annotations

from shared.messages import Generate, OutputOptions, SamplingParams, StreamOpen

GEN = Generate(
    request_id="r",
    model="m",
    token_ids=(1, 2),
    sampling=SamplingParams(max_tokens=50),
    stream_to="",
)
"""Request ``r``'s unrouted ``Generate``: a 2-token prompt, up to 50 tokens."""


def migratable_open(
    gen: Generate | None, *, limit: int = 3, max_seq_len: int = 0, stream: bool = False
) -> StreamOpen:
    """Request ``r`` of ``gen`` (``None``: one that may not migrate) as a formatter opens it."""
    return StreamOpen(
        request_id="r",
        api="chat",
        model="m",
        reply_to="gw",
        created=0,
        prompt_tokens=len(gen.token_ids) if gen else 0,
        output=OutputOptions(stream=stream),
        max_tokens=gen.sampling.max_tokens if gen else 16,
        generate=gen,
        migration_limit=limit if gen else 0,
        migration_max_seq_len=max_seq_len,
    )
