"""``bench/loadgen_spread.py``: the kit's client with prompt lengths spread over a range (the
first words of its longest prompt, counts from its own generator) and pooled token-gap tails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.loadgen_spread import digest, first_words, main, word_counts

FAKE_LOADGEN = """
import argparse, json, random, sys

class _Stream:  # the kit's generator: one per key tuple, draws below n
    def __init__(self, *key):
        self.rng = random.Random(repr(key))
    def below(self, n):
        return self.rng.randrange(n)

def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]

def build_prompts(args):
    work = []
    for i in range(args.num_requests):
        stream = _Stream(args.seed, 2, i)
        words = " ".join(f"w{stream.below(100)}" for _ in range(args.prompt_words))
        work.append((None, f"request {i}: {words}"))
    return [(None, "warmup 0: " + " ".join(["x"] * args.prompt_words))], work, "original"

def summarize(args, model, wall, results):
    return {"model": model, "prompt_words": args.prompt_words}

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prompt-words", type=int)
    p.add_argument("-n", "--num-requests", type=int)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    warmup, work, sha = build_prompts(args)
    results = [{"ok": True, "ttft": 0.2, "e2e": 1.2, "completion_tokens": 11, "chunks": 11,
                "gaps": [0.1] * 9 + [0.5]}]
    out = summarize(args, "M", 1.0, results)
    out.update({"sha": sha, "lengths": [len(u.split()) - 2 for _, u in work],
                "warmup": [len(u.split()) - 2 for _, u in warmup], "work": work})
    print(json.dumps(out))
    return 0
"""


def test_a_prompt_cut_to_its_first_words_keeps_its_tag() -> None:
    assert first_words("request 7: a b c d", 2) == "request 7: a b"
    assert first_words("request 7: a b", 5) == "request 7: a b"


def test_word_counts_span_the_range_from_each_requests_draw() -> None:
    counts = word_counts(lambda i, n: i % n, 5, 10, 12)
    assert counts == [10, 11, 12, 10, 11]
    assert digest([], [(None, "a")]) != digest([], [(None, "b")])


def run_fake(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    fake = tmp_path / "loadgen.py"
    fake.write_text(FAKE_LOADGEN)
    assert main([str(fake), *args]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_prompts_spread_over_the_range_as_prefixes_of_the_longest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["unchanged"])
    argv = ["--prompt-words-max", "40", "--prompt-words", "20", "-n", "50", "--seed", "3"]
    spread = run_fake(tmp_path, capsys, *argv)
    longest = run_fake(tmp_path, capsys, "--prompt-words-max", "40", "--prompt-words", "40",
                       "-n", "50", "--seed", "3")  # fmt: skip
    lengths = spread["lengths"]
    assert isinstance(lengths, list)
    assert all(20 <= n <= 40 for n in lengths)
    assert len(set(lengths)) > 5
    assert spread["warmup"] == [20]
    pairs = zip(spread["work"], longest["work"], strict=True)  # type: ignore[call-overload]
    assert all(full[1].startswith(cut[1]) for cut, full in pairs)
    assert spread["sha"] != "original"
    assert run_fake(tmp_path, capsys, *argv)["sha"] == spread["sha"]  # deterministic
    assert spread["prompt_words"] == 20
    assert spread["prompt_words_max"] == 40
    assert spread["chunk_gap_ms_max"] == 500.0
    samples = spread["samples"]
    assert isinstance(samples, dict)
    assert samples["gap_ms"] == [100.0] * 9 + [500.0]
    assert samples["requests"] == 1


def test_a_maximum_below_the_minimum_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="below --prompt-words"):
        run_fake(tmp_path, capsys, "--prompt-words-max", "10", "--prompt-words", "20", "-n", "1")
