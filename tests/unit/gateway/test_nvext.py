"""``nvext``, ``cache_salt`` and the routing headers mapped onto ``Preprocess``."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.gateway.apis.nvext import Header, routing
from services.gateway.apis.openai import (
    NO_HEADERS,
    RoutingHeaders,
    chat_to_preprocess,
    completion_to_preprocess,
    parse_chat,
    parse_completion,
    routing_headers,
)
from shared.errors import InvalidRequest
from shared.messages import Preprocess, RoutingHints

USER = {"role": "user", "content": "hi"}


def chat(headers: RoutingHeaders = NO_HEADERS, **fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "messages": [USER], **fields})
    return chat_to_preprocess(
        parse_chat(body), request_id="r1", reply_to="gw.r1", created=7, headers=headers
    )


def error(headers: RoutingHeaders = NO_HEADERS, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        chat(headers, **fields)
    return caught.value


class TestRouting:
    def test_plain_request_has_no_routing_and_no_pin(self) -> None:
        req = chat()
        assert (req.routing, req.worker_id, req.output.extra_fields) == (None, None, ())

    def test_nvext_overrides_become_routing_hints(self) -> None:
        req = chat(nvext={"overlap_score_weight": 0.5, "router_temperature": 0.2})
        assert req.routing == RoutingHints(overlap_score_weight=0.5, router_temperature=0.2)

    def test_backend_instance_id_pins_a_worker(self) -> None:
        assert chat(nvext={"backend_instance_id": "mocker-1"}).worker_id == "mocker-1"

    def test_numeric_backend_instance_id_is_a_string_id(self) -> None:
        assert chat(nvext={"backend_instance_id": 42}).worker_id == "42"

    def test_worker_header_pins_a_worker(self) -> None:
        assert chat(RoutingHeaders(worker_instance_id="w7")).worker_id == "w7"

    def test_same_worker_in_body_and_header_is_fine(self) -> None:
        req = chat(RoutingHeaders(worker_instance_id="w7"), nvext={"backend_instance_id": "w7"})
        assert req.worker_id == "w7"

    def test_different_workers_in_body_and_header_are_rejected(self) -> None:
        exc = error(RoutingHeaders(worker_instance_id="w8"), nvext={"backend_instance_id": "w7"})
        assert exc.param == "nvext.backend_instance_id"

    @pytest.mark.parametrize("bad", ["a.b", "w 1", "*", ">", "-1.5"])
    def test_worker_id_that_is_no_subject_token_is_rejected(self, bad: str) -> None:
        assert error(nvext={"backend_instance_id": bad}).param == "nvext.backend_instance_id"
        assert error(RoutingHeaders(worker_instance_id=bad)).param == "x-worker-instance-id"

    def test_cache_salt_from_the_body(self) -> None:
        assert chat(cache_salt="tenant-a").routing == RoutingHints(cache_salt="tenant-a")

    def test_tenant_header_is_the_salt_when_the_body_has_none(self) -> None:
        req = chat(RoutingHeaders(tenant_id="acme"))
        assert req.routing == RoutingHints(cache_salt="acme")

    def test_body_salt_is_scoped_inside_the_tenant(self) -> None:
        req = chat(RoutingHeaders(tenant_id="acme"), cache_salt="s")
        other = chat(RoutingHeaders(tenant_id="evil"), cache_salt="s")
        assert req.routing is not None
        assert other.routing is not None
        # Neither the tenant alone nor the body salt alone: a body cannot escape its tenant.
        assert req.routing.cache_salt == "4:acme:s"
        assert req.routing.cache_salt not in ("acme", "s", other.routing.cache_salt)

    def test_body_cannot_pose_as_another_tenant(self) -> None:
        tenant_b = chat(RoutingHeaders(tenant_id="b")).routing
        posing = chat(RoutingHeaders(tenant_id="a"), cache_salt="b").routing
        assert tenant_b is not None
        assert posing is not None
        assert tenant_b.cache_salt != posing.cache_salt

    def test_nvext_cache_salt_is_the_body_salt(self) -> None:
        req = chat(nvext={"cache_salt": "step_7"})
        assert req.routing == RoutingHints(cache_salt="step_7")
        assert chat(nvext={"cache_salt": "x"}, cache_salt="x").routing == RoutingHints(
            cache_salt="x"
        )

    def test_nvext_salt_wins_over_the_top_level_one_as_in_dynamo(self) -> None:
        req = chat(nvext={"cache_salt": "canonical"}, cache_salt="fallback")
        assert req.routing == RoutingHints(cache_salt="canonical")

    def test_overlong_tenant_header_is_rejected(self) -> None:
        assert error(RoutingHeaders(tenant_id="x" * 257)).param == "x-tenant-id"

    @pytest.mark.parametrize(
        ("nvext", "param"),
        [
            ({"overlap_score_weight": -1}, "nvext.overlap_score_weight"),
            ({"router_temperature": -0.1}, "nvext.router_temperature"),
            ({"backend_instance_id": True}, "nvext.backend_instance_id"),
            ({"extra_fields": "worker_id"}, "nvext.extra_fields"),
        ],
    )
    def test_invalid_nvext_values_are_400s_naming_the_field(
        self, nvext: dict[str, Any], param: str
    ) -> None:
        body = msgspec.json.encode({"model": "m", "messages": [USER], "nvext": nvext})
        with pytest.raises(InvalidRequest) as caught:
            parse_chat(body)
        assert caught.value.param == param

    def test_empty_cache_salt_is_rejected(self) -> None:
        body = msgspec.json.encode({"model": "m", "messages": [USER], "cache_salt": ""})
        with pytest.raises(InvalidRequest) as caught:
            parse_chat(body)
        assert caught.value.param == "cache_salt"


class TestExtraFields:
    def test_worker_id_is_asked_for(self) -> None:
        req = chat(nvext={"extra_fields": ["worker_id"]})
        assert req.output.extra_fields == ("worker_id",)

    def test_unknown_extra_fields_are_ignored(self) -> None:
        req = chat(nvext={"extra_fields": ["routed_experts", "timing", "worker_id", "worker_id"]})
        assert req.output.extra_fields == ("timing", "worker_id")

    def test_completions_take_nvext_too(self) -> None:
        body = msgspec.json.encode(
            {
                "model": "m",
                "prompt": "p",
                "nvext": {"extra_fields": ["worker_id"], "backend_instance_id": "w1"},
            }
        )
        req = completion_to_preprocess(
            parse_completion(body), request_id="r", reply_to="gw.r", created=1
        )
        assert (req.worker_id, req.output.extra_fields) == ("w1", ("worker_id",))


class TestHeaders:
    def test_dynamo_worker_header_pins_and_wins_over_its_alias(self) -> None:
        raw = [(b"x-worker-instance-id", b"w1"), (b"x-dynamo-worker-instance-id", b"w2")]
        headers = routing_headers(raw)
        assert headers.worker_instance_id == "w2"
        assert chat(headers).worker_id == "w2"
        wrong = error(headers, nvext={"backend_instance_id": "w1"})
        assert "`x-dynamo-worker-instance-id`" in wrong.message

    @pytest.mark.parametrize(
        ("raw", "param"),
        [
            ((b"x-dynamo-worker-instance-id", b"a.b"), "x-dynamo-worker-instance-id"),
            ((b"x-worker-instance-id", b"a b"), "x-worker-instance-id"),
            ((b"x-tenant-id", b"t" * 257), "x-tenant-id"),
        ],
    )
    def test_malformed_header_values_are_refused_at_once(
        self, raw: tuple[bytes, bytes], param: str
    ) -> None:
        with pytest.raises(InvalidRequest) as caught:
            routing_headers([raw])
        assert caught.value.param == param

    def test_disaggregation_headers_are_read_the_prefixed_one_winning(self) -> None:
        raw = [
            (b"x-prefill-instance-id", b"old"),
            (b"x-dynamo-prefill-instance-id", b"p1"),
            (b"x-dp-rank", b"1"),
            (b"x-dynamo-prefill-dp-rank", b"2"),
        ]
        picked = routing_headers(raw)
        assert (picked.prefill_instance_id, picked.dp_rank, picked.prefill_dp_rank) == (
            Header("p1", "x-dynamo-prefill-instance-id"),
            Header("1", "x-dp-rank"),
            Header("2", "x-dynamo-prefill-dp-rank"),
        )
        hints, worker_id = routing(None, None, picked)
        assert worker_id is None
        assert hints is not None
        assert (hints.prefill_worker_id, hints.dp_rank, hints.prefill_dp_rank) == ("p1", 1, 2)

    @pytest.mark.parametrize(
        ("raw", "param"),
        [
            ((b"x-dynamo-dp-rank", b"-1"), "x-dynamo-dp-rank"),
            ((b"x-data-parallel-rank", b"one"), "x-data-parallel-rank"),
            ((b"x-dynamo-prefill-dp-rank", b"70000"), "x-dynamo-prefill-dp-rank"),
            ((b"x-dynamo-prefill-instance-id", b"a.b"), "x-dynamo-prefill-instance-id"),
        ],
    )
    def test_malformed_disaggregation_headers_are_400(
        self, raw: tuple[bytes, bytes], param: str
    ) -> None:
        with pytest.raises(InvalidRequest) as caught:
            routing_headers([raw])
        assert caught.value.param == param

    def test_routing_headers_are_picked_from_raw_asgi_headers(self) -> None:
        raw = [(b"x-tenant-id", b"acme"), (b"x-worker-instance-id", b" w1 "), (b"a", b"b")]
        assert routing_headers(raw) == RoutingHeaders(tenant_id="acme", worker_instance_id="w1")

    def test_no_routing_headers(self) -> None:
        assert routing_headers([(b"content-type", b"application/json")]) is NO_HEADERS

    def test_empty_header_values_are_ignored(self) -> None:
        assert routing_headers([(b"x-tenant-id", b"")]) is NO_HEADERS


def headers(*pairs: tuple[str, str]) -> RoutingHeaders:
    return routing_headers([(k.encode(), v.encode()) for k, v in pairs])


def completion(headers: RoutingHeaders = NO_HEADERS, **fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "prompt": "p", **fields})
    return completion_to_preprocess(
        parse_completion(body), request_id="r1", reply_to="gw.r1", created=7, headers=headers
    )


class TestDisaggregationPins:
    """Issue 24's pins, as the seed reads them: the decode (or aggregated) pin is
    ``Preprocess.worker_id``, the rest ride on ``RoutingHints``; the gateway checks only their
    syntax (the router checks them against the fleet)."""

    def test_every_body_pin_reaches_the_router(self) -> None:
        ext = {"decode_worker_id": "d1", "prefill_worker_id": "p1", "dp_rank": 2}
        req = chat(nvext={**ext, "prefill_dp_rank": 0})
        assert req.worker_id == "d1"
        assert req.routing == RoutingHints(
            prefill_worker_id="p1",
            dp_rank=2,
            prefill_dp_rank=0,
            decode_worker_id_param="nvext.decode_worker_id",
        )

    def test_completions_take_the_pins_too(self) -> None:
        req = completion(nvext={"decode_worker_id": 5, "prefill_worker_id": 6})
        assert req.worker_id == "5"
        assert req.routing is not None
        assert (req.routing.prefill_worker_id, req.routing.decode_worker_id_param) == (
            "6",
            "nvext.decode_worker_id",
        )

    def test_every_header_pin_reaches_the_router_named_by_its_header(self) -> None:
        picked = headers(
            ("x-dynamo-worker-instance-id", "d1"),
            ("x-dynamo-prefill-instance-id", "p1"),
            ("x-dynamo-dp-rank", "3"),
            ("x-dynamo-prefill-dp-rank", "1"),
        )
        req = chat(picked)
        assert req.worker_id == "d1"
        assert req.routing == RoutingHints(
            prefill_worker_id="p1",
            dp_rank=3,
            prefill_dp_rank=1,
            decode_worker_id_param="x-dynamo-worker-instance-id",
        )

    @pytest.mark.parametrize(
        ("header", "name"),
        [
            ("x-prefill-instance-id", "prefill"),
            ("x-dp-rank", "rank"),
            ("x-data-parallel-rank", "rank"),
            ("x-prefill-dp-rank", "prefill_rank"),
        ],
    )
    def test_older_header_aliases_pin_alone(self, header: str, name: str) -> None:
        value = "p9" if name == "prefill" else "4"
        routing_ = chat(headers((header, value))).routing
        assert routing_ is not None
        got = {
            "prefill": routing_.prefill_worker_id,
            "rank": routing_.dp_rank,
            "prefill_rank": routing_.prefill_dp_rank,
        }[name]
        assert got == ("p9" if name == "prefill" else 4)

    def test_backend_instance_id_alone_pins_without_hints(self) -> None:
        """The router names ``nvext.backend_instance_id`` when no hint says otherwise."""
        req = chat(nvext={"backend_instance_id": "w1"})
        assert (req.worker_id, req.routing) == ("w1", None)

    def test_backend_instance_id_with_a_rank_is_named_in_the_hints(self) -> None:
        req = chat(nvext={"backend_instance_id": "w1", "dp_rank": 1})
        assert req.worker_id == "w1"
        assert req.routing == RoutingHints(
            dp_rank=1, decode_worker_id_param="nvext.backend_instance_id"
        )

    def test_legacy_header_pin_is_named_by_its_header(self) -> None:
        req = chat(headers(("x-worker-instance-id", "w1"), ("x-dp-rank", "0")))
        assert req.routing == RoutingHints(dp_rank=0, decode_worker_id_param="x-worker-instance-id")

    def test_decode_pin_equal_to_backend_instance_id_is_fine(self) -> None:
        req = chat(nvext={"decode_worker_id": "d1", "backend_instance_id": "d1"})
        assert req.worker_id == "d1"
        assert req.routing is not None
        assert req.routing.decode_worker_id_param == "nvext.decode_worker_id"

    def test_body_and_header_that_agree_are_fine(self) -> None:
        picked = headers(
            ("x-dynamo-worker-instance-id", "d1"),
            ("x-dynamo-prefill-instance-id", "p1"),
            ("x-dynamo-dp-rank", "1"),
            ("x-dynamo-prefill-dp-rank", "0"),
        )
        ext = {"decode_worker_id": "d1", "prefill_worker_id": "p1", "dp_rank": 1}
        req = chat(picked, nvext={**ext, "prefill_dp_rank": 0})
        assert req.worker_id == "d1"
        assert req.routing is not None
        assert (req.routing.prefill_worker_id, req.routing.dp_rank) == ("p1", 1)
        # The body named it: the router's errors name the body field.
        assert req.routing.decode_worker_id_param == "nvext.decode_worker_id"

    @pytest.mark.parametrize(
        ("pairs", "ext", "param"),
        [
            ((), {"decode_worker_id": "a", "backend_instance_id": "b"}, "nvext.decode_worker_id"),
            (
                (("x-dynamo-worker-instance-id", "b"),),
                {"decode_worker_id": "a"},
                "nvext.decode_worker_id",
            ),
            (
                (("x-dynamo-prefill-instance-id", "b"),),
                {"prefill_worker_id": "a"},
                "nvext.prefill_worker_id",
            ),
            ((("x-dynamo-dp-rank", "1"),), {"dp_rank": 0}, "nvext.dp_rank"),
            ((("x-data-parallel-rank", "1"),), {"dp_rank": 2}, "nvext.dp_rank"),
            ((("x-dynamo-prefill-dp-rank", "1"),), {"prefill_dp_rank": 0}, "nvext.prefill_dp_rank"),
        ],
    )
    def test_disagreeing_pins_are_400_naming_the_body_field(
        self, pairs: tuple[tuple[str, str], ...], ext: dict[str, Any], param: str
    ) -> None:
        exc = error(headers(*pairs), nvext=ext)
        assert exc.param == param
        assert exc.status == 400

    @pytest.mark.parametrize(
        ("ext", "param"),
        [
            ({"decode_worker_id": "a.b"}, "nvext.decode_worker_id"),
            ({"decode_worker_id": ""}, "nvext.decode_worker_id"),
            ({"prefill_worker_id": "w 1"}, "nvext.prefill_worker_id"),
            ({"prefill_worker_id": ""}, "nvext.prefill_worker_id"),
            ({"prefill_worker_id": "*"}, "nvext.prefill_worker_id"),
        ],
    )
    def test_worker_ids_that_are_no_subject_tokens_are_400(
        self, ext: dict[str, Any], param: str
    ) -> None:
        assert error(nvext=ext).param == param

    @pytest.mark.parametrize(
        ("ext", "param"),
        [
            ({"dp_rank": -1}, "nvext.dp_rank"),
            ({"dp_rank": 65536}, "nvext.dp_rank"),
            ({"dp_rank": "1"}, "nvext.dp_rank"),
            ({"dp_rank": 1.5}, "nvext.dp_rank"),
            ({"dp_rank": True}, "nvext.dp_rank"),
            ({"prefill_dp_rank": -3}, "nvext.prefill_dp_rank"),
            ({"prefill_dp_rank": "x"}, "nvext.prefill_dp_rank"),
            ({"prefill_worker_id": True}, "nvext.prefill_worker_id"),
            ({"decode_worker_id": [1]}, "nvext.decode_worker_id"),
        ],
    )
    def test_malformed_body_pins_are_400_naming_the_field(
        self, ext: dict[str, Any], param: str
    ) -> None:
        for parse, extra in (
            (parse_chat, {"messages": [USER]}),
            (parse_completion, {"prompt": "p"}),
        ):
            body = msgspec.json.encode({"model": "m", **extra, "nvext": ext})
            with pytest.raises(InvalidRequest) as caught:
                parse(body)
            assert caught.value.param == param

    @pytest.mark.parametrize(
        "raw",
        [b"1.0", b"+1", b"0x1", b"1e3", b"\xd9\xa3", b"9" * 6000, b"65536"],
    )
    def test_rank_headers_take_non_negative_integers_only(self, raw: bytes) -> None:
        for name in (b"x-dynamo-dp-rank", b"x-dynamo-prefill-dp-rank", b"x-dp-rank"):
            with pytest.raises(InvalidRequest) as caught:
                routing_headers([(name, raw)])
            assert caught.value.param == name.decode()

    def test_rank_headers_take_the_bounds(self) -> None:
        picked = headers(("x-dynamo-dp-rank", "0"), ("x-dynamo-prefill-dp-rank", "65535"))
        hints, _ = routing(None, None, picked)
        assert hints is not None
        assert (hints.dp_rank, hints.prefill_dp_rank) == (0, 65535)


class TestQueryOnly:
    @pytest.mark.parametrize(
        "annotations",
        [
            ["query_instance_id"],
            ["query_instance_id:epp-7"],
            ["request_id", "query_instance_id"],
        ],
    )
    def test_query_instance_id_asks_the_router_only(self, annotations: list[str]) -> None:
        for req in (
            chat(nvext={"annotations": annotations}),
            completion(nvext={"annotations": annotations}),
        ):
            assert req.routing is not None
            assert req.routing.query_only
            # It is no SSE event frame: only the other annotations are.
            assert "query_instance_id" not in req.output.annotations

    def test_query_only_keeps_the_pins(self) -> None:
        ext = {"annotations": ["query_instance_id"], "backend_instance_id": "w1", "dp_rank": 1}
        req = chat(nvext=ext)
        assert req.worker_id == "w1"
        assert req.routing == RoutingHints(
            dp_rank=1, decode_worker_id_param="nvext.backend_instance_id", query_only=True
        )

    @pytest.mark.parametrize("annotations", [["query_instance"], ["xquery_instance_id"], []])
    def test_other_annotations_are_no_query(self, annotations: list[str]) -> None:
        assert chat(nvext={"annotations": annotations}).routing is None
