"""Preprocessor configuration: its settings table (``JETSERVE_PREPROCESSOR_*``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.preprocessor.images import ImageLimits
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
    max_images: int = setting(
        8, "Most images in one chat request (decision 032); more are a 400 naming the part", ge=0
    )
    max_image_bytes: int = setting(
        10_000_000,
        "Largest image, bytes, as a data: URL or fetched (a 400 naming the part past it); the "
        "bus's max_payload bounds a request's images too",
        ge=1,
    )
    image_url_domains: str = setting(
        "",
        "Hosts whose http(s) image URLs the preprocessor fetches (each also covers its "
        "subdomains), comma-separated; * = any host; empty = none: images only as data: URLs",
    )
    image_fetch_timeout_s: float = setting(
        10.0, "Seconds to fetch all of a request's image URLs (then a 400 naming the part)", gt=0
    )

    def image_limits(self) -> ImageLimits:
        """The image settings as ``images.check_refs`` takes them."""
        domains = {d.strip().lower().rstrip(".") for d in self.image_url_domains.split(",")}
        return ImageLimits(
            max_images=self.max_images,
            max_bytes=self.max_image_bytes,
            url_domains=frozenset(d for d in domains if d),
        )
