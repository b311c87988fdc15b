"""FormatterPool: round-robin over learned formatters, rediscovery, expiry, drops."""

from __future__ import annotations

from services.preprocessor.formatters import FormatterPool


def pool(**kwargs: float) -> FormatterPool:
    options: dict[str, float] = {"refresh_s": 1.0, "refresh_every": 4, "ttl_s": 30.0} | kwargs
    return FormatterPool(
        refresh_s=options["refresh_s"],
        refresh_every=int(options["refresh_every"]),
        ttl_s=options["ttl_s"],
    )


def test_empty_pool_means_discover() -> None:
    assert pool().pick(0.0) is None


def test_learned_formatters_take_turns() -> None:
    p = pool(refresh_every=100)
    p.learn("a", 0.0)
    p.learn("b", 0.0)
    picks = [p.pick(0.1) for _ in range(4)]
    assert sorted(f or "" for f in picks) == ["a", "a", "b", "b"]
    assert picks[0] != picks[1]


def test_learning_again_does_not_duplicate() -> None:
    p = pool()
    p.learn("a", 0.0)
    p.learn("a", 1.0)
    assert len(p) == 1


def test_rediscovery_needs_both_time_and_requests() -> None:
    p = pool(refresh_s=1.0, refresh_every=4)
    p.learn("a", 0.0)
    # The very first pick after learning: the refresh clock starts at -inf but no requests yet.
    assert [p.pick(0.0) for _ in range(6)] == ["a", "a", "a", "a", None, "a"]
    # Four more direct opens, but within refresh_s of the last discovery: no discovery.
    assert [p.pick(0.5) for _ in range(4)] == ["a"] * 4
    # Enough time and enough requests: one discovery, then direct again.
    assert [p.pick(1.2), p.pick(1.2)] == [None, "a"]


def test_rediscovery_at_low_rates_is_every_n_requests() -> None:
    p = pool(refresh_s=1.0, refresh_every=4)
    p.learn("a", 0.0)
    picks = []
    for n in range(10):
        now = 5.0 * n
        picks.append(p.pick(now))
        if picks[-1] is None:  # the discovery's StreamOpened confirms the formatter
            p.learn("a", now)
    assert picks.count(None) == 2
    assert picks.count("a") == 8


def test_drop_removes_a_bounced_formatter() -> None:
    p = pool(refresh_every=100)
    p.learn("a", 0.0)
    p.learn("b", 0.0)
    p.drop("a")
    assert {p.pick(0.0) for _ in range(3)} == {"b"}
    p.drop("b")
    p.drop("b")  # twice is fine
    assert p.pick(0.0) is None


def test_clear_forgets_everyone() -> None:
    p = pool()
    p.learn("a", 0.0)
    p.clear()
    assert (len(p), p.pick(0.0)) == (0, None)


def test_stale_formatters_leave_the_rotation() -> None:
    p = pool(ttl_s=30.0, refresh_every=100)
    p.learn("old", 0.0)
    p.learn("new", 20.0)
    assert {p.pick(40.0) for _ in range(4)} == {"new"}
    assert "old" not in p
    assert p.pick(60.0) is None  # "new" is stale too now
    assert len(p) == 0


def test_pool_is_bounded_and_forgets_the_least_recently_seen() -> None:
    p = FormatterPool(max_size=2)
    p.learn("a", 0.0)
    p.learn("b", 1.0)
    p.learn("a", 2.0)
    p.learn("c", 3.0)
    assert ("a" in p, "b" in p, "c" in p) == (True, False, True)
