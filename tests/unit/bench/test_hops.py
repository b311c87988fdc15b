"""The per-hop budget bench: subject templates and classes, attribution of messages to c=1
requests, hop deltas, per-request counts and CPU (all pure; no stack, no sockets)."""

from __future__ import annotations

import pytest

from bench.hops import nats_url_of, request_body
from bench.hops_report import (
    FIRST_BYTE,
    HOPS,
    Seen,
    Sent,
    attribute,
    budget,
    group,
    hop_budget,
    latency,
    message_totals,
    pct,
    per_request,
    render,
    split_cpu,
    subject_table,
    windows,
)
from bench.hops_subjects import PATH, PERIODIC, SIDE_EFFECT, category, is_id, template, templates

NS = "jetserve"
RID = "6efe6670f2a24aa1a32f47227e28acb7"
RID2 = "96eee6c07e9645c3b362955855b8bc47"
W = "mocker-d6247a7f"


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("jetserve.v1.preprocess", "jetserve.v1.preprocess"),
        (f"jetserve.v1.worker.{W}.generate", "jetserve.v1.worker.<worker>.generate"),
        (f"jetserve.v1.stream.aebf4fe72565.{RID}", "jetserve.v1.stream.<formatter>.<request>"),
        (f"jetserve.v1.gateway.gw-d052fb37c0fa.{RID}", "jetserve.v1.gateway.<gateway>.<request>"),
        (f"jetserve.v1.bounce.aebf4fe72565-f.{RID}", "jetserve.v1.bounce.<instance>.<request>"),
        ("jetserve.v1.formatter.aebf4fe72565.open", "jetserve.v1.formatter.<formatter>.open"),
        ("jetserve.v1.formatter.open", "jetserve.v1.formatter.open"),
        (f"jetserve.v1.kv.{W}", "jetserve.v1.kv.<worker>"),
        ("jetserve.v1.load.mocker-0", "jetserve.v1.load.<worker>"),
        (
            "$JS.API.CONSUMER.INFO.KV_jetserve_workers.GKJ14gAk",
            "$JS.API.CONSUMER.INFO.KV_jetserve_workers.<consumer>",
        ),
        (
            "$JS.API.CONSUMER.MSG.NEXT.JETSERVE_KV_EVENTS.router",
            "$JS.API.CONSUMER.MSG.NEXT.JETSERVE_KV_EVENTS.<consumer>",
        ),
        (
            "$JS.ACK.KV_jetserve_workers.D3VZylg4.1.26.26.1795694094349839495.0",
            "$JS.ACK.KV_jetserve_workers.<consumer>",
        ),
        (f"$KV.jetserve_workers.{W}", "$KV.jetserve_workers.<key>"),
        (
            "_INBOX.router.YhtTtlcAKxGv3dYPplgRuO.YhtTtlcAKxGv3dYPplgTQt4ee1",
            "_INBOX.router.<inbox>",
        ),
        ("_INBOX.YhtTtlcAKxGv3dYPplgRuO.x1", "_INBOX.<inbox>"),
        ("$JS.EVENT.ADVISORY.API", "$JS.EVENT.ADVISORY.API"),
        ("other.app.1234.deadbeef99", "other.app.<id>.<id>"),
    ],
)
def test_template_replaces_ids_with_what_they_name(subject: str, expected: str) -> None:
    assert template(subject, NS) == expected


def test_words_are_not_ids() -> None:
    assert not any(is_id(w) for w in ("decisions", "generate", "KV_jetserve_workers", "router"))


def test_an_inbox_answer_is_named_after_its_request() -> None:
    inbox = "_INBOX.preprocessor.zfjvgU4vOByBgHdE1G6dCc.zfjvgU4vOByBgHdE1G6iNG0269"
    names = templates([("jetserve.v1.formatter.open", inbox), (inbox, "")], NS)
    assert names[1] == "jetserve.v1.formatter.open [reply]"


def test_a_namespace_reply_to_subject_is_not_taken_for_an_answer() -> None:
    gateway = f"jetserve.v1.gateway.gw-d052fb37c0fa.{RID}"
    names = templates([("jetserve.v1.preprocess", gateway), (gateway, "")], NS)
    assert names[1] == "jetserve.v1.gateway.<gateway>.<request>"


def test_a_jetstream_delivery_is_marked() -> None:
    ack = "$JS.ACK.JETSERVE_KV_EVENTS.abc.1.2.3.4.0"
    assert templates([(f"jetserve.v1.kv.{W}", ack)], NS) == ["jetserve.v1.kv.<worker> [delivery]"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("jetserve.v1.worker.<worker>.generate", PATH),
        ("jetserve.v1.formatter.open [reply]", PATH),
        ("jetserve.v1.decisions", SIDE_EFFECT),
        ("jetserve.v1.kv.<worker> [reply]", SIDE_EFFECT),
        ("$JS.ACK.JETSERVE_KV_EVENTS.<consumer>", SIDE_EFFECT),
        ("$KV.jetserve_workers.<key> [delivery]", PERIODIC),
        ("$JS.API.CONSUMER.INFO.KV_jetserve_workers.<consumer>", PERIODIC),
    ],
)
def test_category_of_a_template(name: str, expected: str) -> None:
    assert category(name, NS) == expected


def sent(*sends: float, ttft: float = 0.005, e2e: float = 0.008) -> list[Sent]:
    return [Sent(send=s, first_byte=s + ttft, end=s + e2e) for s in sends]


def test_windows_run_from_one_send_to_the_next_and_the_last_lasts_the_median() -> None:
    assert windows(sent(1.0, 1.5, 2.5)) == [(1.0, 1.5), (1.5, 2.5), (2.5, 3.25)]


def test_a_lone_request_window_is_its_own_duration() -> None:
    assert windows(sent(5.0)) == [(5.0, 5.008)]


def test_attribute_puts_times_in_windows_and_outside_ones_at_minus_one() -> None:
    spans = [(1.0, 2.0), (2.0, 3.0)]
    assert attribute([0.5, 1.0, 1.99, 2.0, 2.5, 3.0], spans) == [-1, 0, 0, 1, 1, -1]


def request_messages(t0: float, rid: str = RID) -> list[Seen]:
    """One request's path as the observer sees it, ms after the send at ``t0``."""
    path = [
        (1.0, "jetserve.v1.preprocess", f"jetserve.v1.gateway.gw-d052fb37c0fa.{rid}"),
        (2.0, "jetserve.v1.router.generate", f"jetserve.v1.bounce.116827ff3790.{rid}"),
        (2.5, f"jetserve.v1.worker.{W}.generate", f"jetserve.v1.bounce.4edd5ce61f15.{rid}"),
        (2.6, "jetserve.v1.decisions", ""),
        (4.0, f"jetserve.v1.stream.aebf4fe72565.{rid}", ""),
        (4.1, f"jetserve.v1.stream.aebf4fe72565.{rid}", ""),
        (4.5, f"jetserve.v1.gateway.gw-d052fb37c0fa.{rid}", ""),
    ]
    return [Seen(t=t0 + ms / 1000, subject=s, reply=r, size=100) for ms, s, r in path]


def two_requests() -> tuple[list[Seen], list[Sent]]:
    heartbeat = Seen(t=1.0125, subject=f"$KV.jetserve_workers.{W}", reply="", size=50)
    both = [*request_messages(1.0), *request_messages(1.01, RID2), heartbeat]
    seen = sorted(both, key=lambda m: m.t)
    return seen, sent(1.0, 1.01)


def test_subject_table_counts_messages_per_request_and_their_first_offset() -> None:
    seen, reqs = two_requests()
    table = subject_table(group(seen, reqs, NS), NS)
    stream = table["jetserve.v1.stream.<formatter>.<request>"]
    assert (stream["per_request_median"], stream["first_at_ms_median"]) == (2, 4.0)


def test_subject_table_charges_a_periodic_message_to_the_window_it_fell_in() -> None:
    seen, reqs = two_requests()
    row = subject_table(group(seen, reqs, NS), NS)["$KV.jetserve_workers.<key>"]
    assert (row["category"], row["per_request_mean"]) == (PERIODIC, 0.5)


def test_hop_budget_is_the_median_delta_between_consecutive_first_messages() -> None:
    seen, reqs = two_requests()
    hops = hop_budget(group(seen, reqs, NS), reqs, NS)
    deltas = [h["delta_ms_median"] for h in hops]
    assert deltas == pytest.approx([1.0, 1.0, 0.5, 1.5, 0.5, 0.5])


def test_hop_budget_ends_at_the_clients_first_byte() -> None:
    assert [to for _, _, to in HOPS][-1] == FIRST_BYTE


def test_a_late_message_of_a_request_is_charged_to_it_not_to_the_next() -> None:
    seen, reqs = two_requests()
    late = Seen(t=1.0105, subject=f"jetserve.v1.gateway.gw-d052fb37c0fa.{RID}", reply="", size=9)
    grouped = group(sorted([*seen, late], key=lambda m: m.t), reqs, NS)
    gateway = "jetserve.v1.gateway.<gateway>.<request>"
    assert [sum(n == gateway for n, _, _ in w) for w in grouped.per] == [2, 1]


def test_message_totals_split_path_side_effects_and_periodic() -> None:
    seen, reqs = two_requests()
    totals = message_totals(group(seen, reqs, NS), NS)
    assert (totals["path_mean"], totals["side_effect_mean"], totals["periodic_mean"]) == (
        6.0,
        1.0,
        0.5,
    )


def test_messages_before_the_first_send_are_outside_every_window() -> None:
    seen, reqs = two_requests()
    early = Seen(t=0.5, subject="jetserve.v1.load.mocker-0", reply="", size=10)
    assert budget([early, *seen], reqs, NS)["outside_windows"] == 1


def test_latency_is_ttft_percentiles_in_ms() -> None:
    assert latency(sent(1.0, 2.0, ttft=0.004))["ttft_ms_p50"] == pytest.approx(4.0)


def test_pct_is_nearest_rank_and_none_without_values() -> None:
    assert (pct([3.0, 1.0, 2.0], 50), pct([], 50)) == (2.0, None)


def test_per_request_scales_the_difference() -> None:
    assert per_request({"a": 1.0, "b": 0.0}, {"a": 1.2, "c": 5.0}, 100, 1000.0) == {"a": 2.0}


def test_split_cpu_adds_launcher_and_unattributed() -> None:
    cpu = {"gateway": 2.0, "nats": 1.0, "server": 3.5, "client": 1.0, "observer": 0.5}
    out = split_cpu({**cpu, "machine": 6.0}, ["gateway", "nats"])
    assert (out["launcher"], out["unattributed"]) == (0.5, 1.0)


def test_render_names_every_hop() -> None:
    seen, reqs = two_requests()
    cpu = {"gateway": 1.0}
    result = {
        **budget(seen, reqs, NS),
        "ttft": {"unobserved": latency(reqs), "observed": latency(reqs)},
        "cpu_ms_per_request": {"unobserved": cpu, "observed": cpu},
        "ctx_switches_per_request": {"unobserved": cpu, "observed": cpu},
        "load1": {"unobserved": 0.5},
    }
    text = render(result)
    assert all(who in text for who, _, _ in HOPS)


def test_nats_url_comes_from_the_up_line() -> None:
    line = (
        "JetServe is up: http://127.0.0.1:36401/v1 and gRPC (KServe v2) 127.0.0.1:45081  "
        "(model Qwen/Qwen3-0.6B, 2 mocker workers, NATS nats://127.0.0.1:54819)\n"
    )
    assert nats_url_of(line) == "nats://127.0.0.1:54819"


def test_every_request_asks_for_all_its_tokens() -> None:
    body = request_body("M", "hi", 32)
    assert (body["ignore_eos"], body["max_tokens"], body["stream"]) == (True, 32, True)
