"""One ``EmbedTokens`` in, its ``EmbedResult`` out: checks, then the vectors. Pure."""

from __future__ import annotations

from services.embedder.vectors import embed, to_float32_le, truncated
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import EmbedResult, EmbedTokens


def check(request: EmbedTokens, *, model: str, size: int) -> int:
    """The width of the answer's vectors.

    Raises:
        ModelNotFound: the request is for another model than ``model``.
        InvalidRequest: ``dimensions`` is below 1 or above the model's ``size``, or an input
            has no tokens.
    """
    if request.model != model:
        raise ModelNotFound(request.model)
    dimensions = request.dimensions
    if dimensions is not None and not 1 <= dimensions <= size:
        raise InvalidRequest(
            f"dimensions must be between 1 and {size} for model `{model}`, got {dimensions}",
            param="dimensions",
        )
    if any(not ids for ids in request.token_ids):
        raise InvalidRequest("an input has no tokens", param="input")
    return size if dimensions is None else dimensions


def answer(request: EmbedTokens, *, model: str, size: int, worker_id: str) -> EmbedResult:
    """The vectors of every input of ``request``, in order (``check`` first)."""
    width = check(request, model=model, size=size)
    vectors = [truncated(embed(ids, size), width) for ids in request.token_ids]
    return EmbedResult(
        request_id=request.request_id,
        model=model,
        dimensions=width,
        vectors=to_float32_le(vectors),
        prompt_tokens=sum(len(ids) for ids in request.token_ids),
        worker_id=worker_id,
    )
