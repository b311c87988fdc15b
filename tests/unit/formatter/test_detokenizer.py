"""Incremental detokenization with the real Qwen3 tokenizer: UTF-8 splits, stop strings, EOS,
control characters."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

from services.formatter.detokenizer import Detokenizer, visible_text

IM_END = 151645  # <|im_end|>, a Qwen3 EOS id
RARE = "\U0001d518\U0001d52b\U0001d526 ᚠᛇᚻ ꙮ 🦜🧬 ñ"  # Fraktur "Uni", runes: split over ids


def ids_of(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def feed(detok: Detokenizer, ids: list[int], batch: int) -> list[str]:
    """Push ``ids`` ``batch`` at a time; return what was shown after each push."""
    return [detok.push(ids[i : i + batch]) for i in range(0, len(ids), batch)]


class TestUtf8:
    @pytest.mark.parametrize("text", ["héllo 🙂 世界", RARE, "😀😃🫠"])
    def test_one_id_at_a_time_rebuilds_the_text(self, tokenizer: Any, text: str) -> None:
        pieces = feed(Detokenizer(tokenizer), ids_of(tokenizer, text), batch=1)
        assert "".join(pieces) == text

    def test_characters_split_across_ids_are_never_shown_half(self, tokenizer: Any) -> None:
        text = RARE
        pieces = feed(Detokenizer(tokenizer), ids_of(tokenizer, text), batch=1)
        assert "" in pieces  # some ids complete no character on their own
        assert all("\ufffd" not in p for p in pieces)

    def test_a_batch_of_ids_decodes_like_single_ids(self, tokenizer: Any) -> None:
        text = "héllo 🙂 世界, and more text after it"
        pieces = feed(Detokenizer(tokenizer), ids_of(tokenizer, text), batch=3)
        assert "".join(pieces) == text

    def test_counts_every_id(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer)
        ids = ids_of(tokenizer, "héllo 🙂 世界")
        feed(detok, ids, batch=2)
        assert detok.completion_tokens == len(ids)


class TestStopStrings:
    TEXT = "The answer is 42. END OF ANSWER and then more words"

    @pytest.mark.parametrize("batch", [1, 2, 3, 8])
    @pytest.mark.parametrize("stop", ["END OF", "42.", " and then", "nswer is"])
    def test_never_leaks_any_part_of_a_stop_string(
        self, tokenizer: Any, batch: int, stop: str
    ) -> None:
        detok = Detokenizer(tokenizer, stop=(stop,))
        expected = self.TEXT[: self.TEXT.index(stop)]
        shown = ""
        for piece in feed(detok, ids_of(tokenizer, self.TEXT), batch):
            shown += piece
            assert expected.startswith(shown), f"leaked {shown!r}"
        assert shown == expected
        assert detok.stopped

    @pytest.mark.parametrize("batch", [1, 4])
    def test_include_stop_str_keeps_the_stop_string_and_nothing_after(
        self, tokenizer: Any, batch: int
    ) -> None:
        detok = Detokenizer(tokenizer, stop=("END OF",), include_stop_str_in_output=True)
        shown = "".join(feed(detok, ids_of(tokenizer, self.TEXT), batch))
        assert shown == "The answer is 42. END OF"

    def test_earliest_of_several_stop_strings_wins(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, stop=("more", "42"))
        shown = "".join(feed(detok, ids_of(tokenizer, self.TEXT), batch=64))
        assert shown == "The answer is "

    def test_held_back_prefix_is_released_when_it_cannot_complete(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, stop=("ENDING",))
        shown = "".join(feed(detok, ids_of(tokenizer, "so it goes to the END"), batch=1))
        assert shown == "so it goes to the "
        assert detok.flush() == "END"

    def test_flush_after_a_stop_shows_nothing(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, stop=("42",))
        feed(detok, ids_of(tokenizer, self.TEXT), batch=64)
        assert detok.flush() == ""

    def test_ids_after_the_stop_string_are_not_counted(self, tokenizer: Any) -> None:
        ids = ids_of(tokenizer, self.TEXT)
        prefix = ids_of(tokenizer, "The answer is 42.")
        assert ids[: len(prefix)] == prefix
        detok = Detokenizer(tokenizer, stop=("42.",))
        detok.push(ids)
        assert detok.completion_tokens == len(prefix)

    def test_pushes_after_a_stop_are_ignored(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, stop=("42",))
        feed(detok, ids_of(tokenizer, self.TEXT), batch=64)
        assert detok.push(ids_of(tokenizer, "more")) == ""


class TestStopTokenId:
    def test_stop_token_is_counted_but_not_shown(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, skip_special_tokens=False)
        ids = [*ids_of(tokenizer, "Hi there"), IM_END]
        shown = detok.push(ids, stop_token_id=IM_END)
        assert (shown, detok.completion_tokens) == ("Hi there", len(ids))

    def test_stop_token_alone_in_its_batch(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, stop=("zzz",), skip_special_tokens=False)
        detok.push(ids_of(tokenizer, "Hi"))
        assert detok.push([IM_END], stop_token_id=IM_END) == ""
        assert detok.completion_tokens == 2

    def test_include_stop_str_shows_the_stop_token(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, skip_special_tokens=False, include_stop_str_in_output=True)
        shown = detok.push([*ids_of(tokenizer, "Hi"), IM_END], stop_token_id=IM_END)
        assert shown == "Hi<|im_end|>"

    def test_special_tokens_are_skipped_by_default(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer)
        assert detok.push([*ids_of(tokenizer, "Hi"), IM_END]) == "Hi"


class TestControlCharacters:
    """Control characters never reach a client; tab, line feed and carriage return do."""

    DIRTY = "red\x1b[31m alert\x07\x00 done\ttab\r\nnext\x7f \x85x\x08"
    CLEAN = "red[31m alert done\ttab\r\nnext x"

    @pytest.mark.parametrize(
        ("text", "visible"),
        [
            ("plain text, nothing to drop", "plain text, nothing to drop"),
            ("", ""),
            ("a\x00b\x1bc\x7fd\x9fe", "abcde"),
            ("keep\ttab\nline\r\n", "keep\ttab\nline\r\n"),
            ("no-break\u00a0space, é, 世界, 🙂", "no-break\u00a0space, é, 世界, 🙂"),
            (DIRTY, CLEAN),
        ],
    )
    def test_visible_text_drops_control_characters_only(self, text: str, visible: str) -> None:
        assert visible_text(text) == visible

    def test_every_unicode_control_character_but_three_is_dropped(self) -> None:
        controls = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]
        assert visible_text("".join(controls)) == "\t\n\r"

    @pytest.mark.parametrize("batch", [1, 4])
    def test_the_detokenizer_shows_text_without_them(self, tokenizer: Any, batch: int) -> None:
        pieces = feed(Detokenizer(tokenizer), ids_of(tokenizer, self.DIRTY), batch)
        assert "".join(pieces) == self.CLEAN

    def test_stop_strings_are_found_in_the_visible_text(self, tokenizer: Any) -> None:
        detok = Detokenizer(tokenizer, stop=("alert done",))
        text = "".join(feed(detok, ids_of(tokenizer, self.DIRTY), batch=1)) + detok.flush()
        assert (text, detok.stopped) == ("red[31m ", True)
