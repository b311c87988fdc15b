"""TLS: ``--tls-cert-path`` / ``--tls-key-path`` serve HTTPS (the real ``build_server`` on real
NATS, a self-signed certificate made with the ``openssl`` CLI), and every wrong combination is a
clear start-up error naming the flag."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.gateway.config import GatewayConfig
from services.gateway.server import TlsError, build_server, tls_options
from shared.subjects import Subjects
from tests.integration.gateway_support import gateway_config, until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not found")


OPENSSL_SELF_SIGNED = (
    *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
    *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
)


@pytest.fixture(scope="module")
def cert_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost / 127.0.0.1 and its key."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [*OPENSSL_SELF_SIGNED, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
async def https_gateway(
    nats_url: str, subjects: Subjects, cert_pair: tuple[Path, Path]
) -> AsyncIterator[GatewayConfig]:
    cert, key = cert_pair
    config = gateway_config(nats_url, subjects, 5.0, tls_cert_path=cert, tls_key_path=key)
    server = build_server(config)
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), "uvicorn to start")
    assert server.started, "gateway failed to start"
    try:
        yield config
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_https_is_served_with_the_certificate(
    https_gateway: GatewayConfig, cert_pair: tuple[Path, Path]
) -> None:
    trusted = ssl.create_default_context(cafile=str(cert_pair[0]))
    base = f"https://localhost:{https_gateway.http_port}"
    async with httpx.AsyncClient(base_url=base, verify=trusted, timeout=5) as client:
        live = await client.get("/live")
        assert (live.status_code, live.json()) == (200, {"status": "ok"})
        # The inference path (raw ASGI) is behind the same TLS listener.
        bad = await client.post("/v1/chat/completions", json={"model": "m", "frob": 1})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "frob"
        assert "x-request-id" in bad.headers


async def test_an_untrusted_client_and_plain_http_are_refused(https_gateway: GatewayConfig) -> None:
    port = https_gateway.http_port
    async with httpx.AsyncClient(timeout=5) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get(f"https://localhost:{port}/live")
        with pytest.raises(httpx.HTTPError):  # a TLS listener does not speak plain HTTP
            await client.get(f"http://localhost:{port}/live")


class TestStartupErrors:
    def test_cert_without_key_names_the_missing_flag(self, cert_pair: tuple[Path, Path]) -> None:
        with pytest.raises(ValueError, match=r"--tls-cert-path is set but --tls-key-path is not"):
            GatewayConfig(tls_cert_path=cert_pair[0])
        with pytest.raises(ValueError, match=r"--tls-key-path is set but --tls-cert-path is not"):
            GatewayConfig(tls_key_path=cert_pair[1])

    def test_missing_file_is_named(self, cert_pair: tuple[Path, Path], tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"--tls-key-path .*nope\.pem: no such file"):
            GatewayConfig(tls_cert_path=cert_pair[0], tls_key_path=tmp_path / "nope.pem")

    @pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
    def test_unreadable_file_is_named(self, cert_pair: tuple[Path, Path], tmp_path: Path) -> None:
        locked = tmp_path / "locked.pem"
        locked.write_bytes(cert_pair[1].read_bytes())
        locked.chmod(0)
        with pytest.raises(ValueError, match=r"--tls-key-path .*not readable"):
            GatewayConfig(tls_cert_path=cert_pair[0], tls_key_path=locked)

    def test_a_key_that_is_not_pem_is_refused(
        self, cert_pair: tuple[Path, Path], tmp_path: Path
    ) -> None:
        junk = tmp_path / "junk.pem"
        junk.write_text("not a key")
        config = GatewayConfig(tls_cert_path=cert_pair[0], tls_key_path=junk)
        with pytest.raises(TlsError, match="not a PEM certificate and its private key"):
            tls_options(config)

    def test_no_tls_means_no_ssl_options(self) -> None:
        assert tls_options(GatewayConfig()) == {}

    def test_the_command_line_exits_with_the_reason(self, tmp_path: Path) -> None:
        cert = tmp_path / "c.pem"
        cert.write_text("x")
        done = subprocess.run(
            [sys.executable, "-m", "services.gateway", "--tls-cert-path", str(cert)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0
        assert "--tls-key-path is not" in done.stderr

    def test_the_command_line_refuses_a_bad_pair_before_serving(self, tmp_path: Path) -> None:
        cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
        cert.write_text("x")
        key.write_text("y")
        done = subprocess.run(
            [
                *(sys.executable, "-m", "services.gateway", "--nats-url", "nats://127.0.0.1:1"),
                *("--tls-cert-path", str(cert), "--tls-key-path", str(key)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1
        assert "not a PEM certificate" in done.stderr
