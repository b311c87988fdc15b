"""The echo itself: a ``TensorInfer`` in, its inputs back as outputs in a ``TensorResult``. Pure.

Nothing is checked against the model's spec (the gateway does that); contents, datatype, shape
and per-tensor parameters come back untouched, under the output name each input pairs with.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.errors import ModelNotFound
from shared.messages import Tensor, TensorInfer, TensorResult


def echo(request: TensorInfer, *, model: str, names: Mapping[str, str]) -> TensorResult:
    """Every input back under its output name; with requested outputs, only those.

    Raises:
        ModelNotFound: the request is for another model than ``model``.
    """
    if request.model != model:
        raise ModelNotFound(request.model)
    outputs = tuple(_renamed(t, names.get(t.name, t.name)) for t in request.inputs)
    if request.outputs:
        wanted = frozenset(request.outputs)
        outputs = tuple(t for t in outputs if t.name in wanted)
    return TensorResult(
        request_id=request.request_id,
        model=request.model,
        outputs=outputs,
        model_version=request.model_version,
        id=request.id,
        parameters=request.parameters,
    )


def _renamed(tensor: Tensor, name: str) -> Tensor:
    return tensor if tensor.name == name else msgspec.structs.replace(tensor, name=name)
