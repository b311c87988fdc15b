"""Preprocessor configuration: its settings table (``JETSERVE_PREPROCESSOR_*``)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import CommonConfig, setting


@dataclass(frozen=True, slots=True, kw_only=True)
class PreprocessorConfig(CommonConfig):
    """Everything the preprocessor needs to run."""

    SERVICE = "preprocessor"
    DESCRIPTION = "Apply chat templates and tokenize requests."

    formatter_timeout_s: float = setting(
        2.0,
        "Seconds to wait for a formatter to open a stream (then a 503 the gateway resubmits)",
        gt=0,
    )
    max_model_len: int = setting(0, "Context length override; 0 = the model card's", ge=0)
    max_cached_models: int = setting(
        8, "Models whose tokenizer and template stay loaded (least recently used go first)", ge=1
    )
    direct_open: bool = setting(
        True,
        "Send StreamOpen straight to a known formatter without waiting for its answer "
        "(decision 013); --no-direct-open = always the request/reply handshake",
    )
    migration_limit: int = setting(
        3,
        "How many times a request may be routed again when its worker is lost (Dynamo's "
        "--migration-limit; decision 017). 0 = never: the request fails with worker_lost",
        ge=0,
    )
    migration_max_seq_len: int = setting(
        0,
        "Do not migrate a request whose prompt + generated tokens exceed this "
        "(Dynamo's --migration-max-seq-len); 0 = no limit",
        ge=0,
    )
