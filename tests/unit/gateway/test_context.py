"""Request ids: accept a client's safe ``X-Request-Id``, otherwise mint one."""

from __future__ import annotations

import pytest

from services.gateway.core.context import request_id_from


def test_valid_client_request_id_is_kept() -> None:
    assert request_id_from([(b"x-request-id", b"req-42_A")]) == "req-42_A"


@pytest.mark.parametrize("value", [b"a.b", b"a b", b"*", b"", b"x" * 65])
def test_unsafe_or_long_request_id_is_replaced(value: bytes) -> None:
    minted = request_id_from([(b"x-request-id", value)])
    assert minted != value.decode()
    assert len(minted) == 32


def test_missing_header_mints_a_uuid_hex() -> None:
    minted = request_id_from([(b"content-type", b"application/json")])
    assert len(minted) == 32
    assert int(minted, 16) >= 0
