"""Echo tensor worker configuration: its settings table (``JETSERVE_ECHO_TENSOR_*``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from services.echo_tensor.spec import DEFAULT_INPUTS, DEFAULT_OUTPUTS, flag_spec
from shared.config import CommonConfig, computed_setting, setting
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token


def _random_id() -> str:
    return f"echo-tensor-{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EchoTensorConfig(CommonConfig):
    """One echo worker: a KServe tensor model whose outputs are its inputs."""

    SERVICE = "echo_tensor"
    DESCRIPTION = "A tensor model worker (KServe v2) that returns its inputs as its outputs."

    model_name: str = setting("echo", "Served model name")
    worker_id: str = computed_setting(
        _random_id,
        "Worker id, the subject token of its tensor requests (empty = random)",
        default_doc="random",
        per_instance=True,
    )
    worker_ttl_s: float = setting(
        DEFAULT_WORKER_TTL_S, "Worker card TTL; heartbeat every TTL/3", gt=0
    )
    inputs: str = setting(
        DEFAULT_INPUTS,
        "The model's inputs: NAME:DATATYPE:SHAPE[:optional], comma-separated; SHAPE is dims "
        "joined by x (-1 = variable). Ignored with --triton-model-config",
    )
    outputs: str = setting(
        DEFAULT_OUTPUTS,
        "The model's outputs, as --inputs; the i-th input comes back as the i-th output (same "
        "datatype), an input past the last output under its own name ('same' = every input "
        "under its own name). Ignored with --triton-model-config",
    )
    triton_model_config: Path | None = setting(
        None,
        "A Triton ModelConfig file (.json: Triton's JSON form; .pb/.bin: serialized; else "
        "config.pbtxt text) giving the inputs and outputs; returned verbatim by ModelConfig",
    )

    def __post_init__(self) -> None:
        # Not super(): slotted dataclasses are rebuilt, which breaks zero-argument super().
        CommonConfig.__post_init__(self)
        check_token(self.worker_id, "--worker-id / JETSERVE_ECHO_TENSOR_WORKER_ID")
        if self.triton_model_config is None:
            flag_spec(self.inputs, self.outputs)  # a bad spec is a usage error, at once
