"""RecentIds forgets by age and by size."""

from shared.recent import RecentIds


def test_remembers_an_id_until_it_expires() -> None:
    ids = RecentIds(ttl_s=10)
    ids.add("a", now=0)
    assert ids.pop("a", now=5) is True
    assert ids.pop("a", now=5) is False


def test_expired_ids_are_forgotten() -> None:
    ids = RecentIds(ttl_s=10)
    ids.add("a", now=0)
    assert ids.pop("a", now=11) is False


def test_oldest_ids_are_dropped_past_the_size_limit() -> None:
    ids = RecentIds(ttl_s=100, max_size=2)
    for i, key in enumerate("abc"):
        ids.add(key, now=i)
    assert len(ids) == 2
    assert ids.pop("a", now=3) is False
    assert ids.pop("c", now=3) is True
