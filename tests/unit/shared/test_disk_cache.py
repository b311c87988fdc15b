"""The local copy of model files: served only while its bytes match the store's digest."""

from __future__ import annotations

from pathlib import Path

from shared.registry.disk_cache import DiskCache
from shared.registry.jetstream import content_digest


def test_what_was_put_is_found_by_its_digest(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    cache.put(b"tokenizer bytes")
    assert cache.get(content_digest(b"tokenizer bytes")) == b"tokenizer bytes"
    assert cache.get(content_digest(b"other bytes")) is None


def test_a_corrupted_copy_is_never_served(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    cache.put(b"tokenizer bytes")
    [path] = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    path.write_bytes(b"tokenizer byteX")
    assert cache.get(content_digest(b"tokenizer bytes")) is None


def test_an_unwritable_directory_just_means_not_cached(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = DiskCache(blocker / "sub")
    cache.put(b"data")
    assert cache.get(content_digest(b"data")) is None
