"""A local copy of model files read from the object store, keyed by content digest.

A preprocessor or formatter that restarts reads its tokenizer (11 MB for Qwen3) again; from the
object store that takes ~0.7 s on the reference VM, from local disk milliseconds. Only what
this machine itself downloaded is kept, under ``$JETSERVE_CACHE_DIR`` (default
``~/.cache/jetserve/objects``); a file is used only if its bytes still hash to the digest the
store reports, so a stale or torn copy is never served. Any disk error means "not cached".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from shared.registry.jetstream import content_digest


def cache_dir() -> Path:
    configured = os.environ.get("JETSERVE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "jetserve" / "objects"


class DiskCache:
    """Bytes by digest (``SHA-256=…``) in one directory."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_dir()

    def _path(self, digest: str) -> Path:
        return self.root / hashlib.sha256(digest.encode()).hexdigest()

    def get(self, digest: str) -> bytes | None:
        """The cached bytes with this digest, or ``None``."""
        try:
            data = self._path(digest).read_bytes()
        except OSError:
            return None
        return data if content_digest(data) == digest else None

    def put(self, data: bytes) -> None:
        """Keep ``data`` (atomically: a reader never sees a partial file)."""
        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(tmp, self._path(content_digest(data)))
            except OSError:
                Path(tmp).unlink(missing_ok=True)
