"""Subjects are namespaced, versioned and validated."""

import pytest

from shared.subjects import Subjects, request_id_of


def test_subjects_are_namespaced_and_versioned() -> None:
    s = Subjects("ns")
    assert s.preprocess == "ns.v1.preprocess"
    assert s.generate("w1") == "ns.v1.worker.w1.generate"
    assert s.reply("g1", "r1") == "ns.v1.gateway.g1.r1"
    assert s.reply_all("g1") == "ns.v1.gateway.g1.*"
    assert s.stream("f1", "r1") == "ns.v1.stream.f1.r1"


def test_request_id_is_the_last_token() -> None:
    assert request_id_of(Subjects("ns").reply("g", "abc")) == "abc"


@pytest.mark.parametrize("bad", ["a.b", "", "a b", "a*", ">"])
def test_invalid_namespace_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        Subjects(bad)


def test_buckets_have_no_dots() -> None:
    s = Subjects("ns")
    assert "." not in s.workers_bucket
    assert "." not in s.models_store
