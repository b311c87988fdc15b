"""Services against a NATS server that wants TLS, a client certificate and a password (issue 12):
a real ``nats-server`` started from a config file with certificates this test makes (``trustme``:
a throwaway CA); the ``--nats-*`` settings get a service in, and a client without them is kept
out by the server."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
import trustme
from nats.aio.client import Client

from services.mocker.config import MockerConfig
from services.mocker.service import Mocker, ModelInfo
from shared.bus import connect
from shared.lifecycle import serving
from shared.nats_auth import NatsAuth
from shared.registry import WorkerDirectory
from shared.subjects import Subjects
from tests.support import eventually_async, free_port, nats_server_binary, wait_for_port

USER, PASSWORD = "svc", "s3cret-pass"


@dataclass(frozen=True)
class SecureNats:
    """The server's address and the files a client needs."""

    port: int
    ca: Path
    client_cert: Path
    client_key: Path

    def url(self, credentials: str = f"{USER}:{PASSWORD}@") -> str:
        return f"tls://{credentials}127.0.0.1:{self.port}"

    def auth(self, *, client_cert: bool = True) -> NatsAuth:
        if not client_cert:
            return NatsAuth(tls_ca=self.ca)
        return NatsAuth(tls_ca=self.ca, tls_cert=self.client_cert, tls_key=self.client_key)


@pytest.fixture(scope="module")
def secure_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureNats]:
    binary = nats_server_binary()
    if binary is None:
        pytest.fail("nats-server not found; install the test extras")
    root = tmp_path_factory.mktemp("secure-nats")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("jetserve-service")
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    client.cert_chain_pems[0].write_to_path(str(root / "client.pem"))
    client.private_key_pem.write_to_path(str(root / "client.key"))
    port = free_port()
    (root / "nats.conf").write_text(
        f"""
listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{root / "js"}" }}
tls {{
  cert_file: "{root / "server.pem"}"
  key_file: "{root / "server.key"}"
  ca_file: "{root / "ca.pem"}"
  verify: true
  timeout: 2
}}
authorization {{ users: [ {{ user: "{USER}", password: "{PASSWORD}" }} ] }}
"""
    )
    proc = subprocess.Popen(
        [binary, "-c", str(root / "nats.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout_s=10)
        yield SecureNats(port, root / "ca.pem", root / "client.pem", root / "client.key")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _refused(url: str, auth: NatsAuth) -> str:
    """Try once; the error the server (or the TLS handshake) answered with."""
    try:
        nc = await nats.connect(
            url, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False,
            **auth.connect_options(),
        )  # fmt: skip
    except Exception as exc:  # what nats-py raises differs by cause; the test reads its text
        return f"{type(exc).__name__}: {exc}"
    await nc.close()
    return ""


async def test_a_service_with_the_settings_gets_in(secure_nats: SecureNats) -> None:
    nc = await connect(secure_nats.url(), name="tls-test", **secure_nats.auth().connect_options())
    try:
        sub = await nc.subscribe("tls.test")
        await nc.publish("tls.test", b"over tls")
        msg = await sub.next_msg(timeout=2)
        assert msg.data == b"over tls"
        assert nc.connected_url is not None
        assert nc.connected_url.scheme == "tls"
    finally:
        await nc.close()


async def test_no_password_is_refused_by_the_server(secure_nats: SecureNats) -> None:
    error = await _refused(secure_nats.url(credentials=""), secure_nats.auth())
    assert "Authorization Violation" in error or "authorization" in error.lower(), error


async def test_a_wrong_password_is_refused(secure_nats: SecureNats) -> None:
    error = await _refused(secure_nats.url(credentials=f"{USER}:wrong@"), secure_nats.auth())
    assert "authorization" in error.lower(), error


async def test_no_client_certificate_is_refused(secure_nats: SecureNats) -> None:
    error = await _refused(secure_nats.url(), secure_nats.auth(client_cert=False))
    # TLS 1.3: the refusal comes as the server's alert (certificate required) or, if the client
    # reads first, as the connection closed under it; either way nobody got in.
    assert error, "the server let a client without a certificate in"


async def test_a_server_not_signed_by_the_ca_is_not_trusted(secure_nats: SecureNats) -> None:
    error = await _refused(secure_nats.url(), NatsAuth())  # the system's CAs
    assert "CERTIFICATE_VERIFY_FAILED" in error or "certificate" in error.lower(), error


async def test_a_worker_registers_through_the_settings(
    secure_nats: SecureNats, model_info: ModelInfo
) -> None:
    """The ``--nats-*`` settings, as every service reads them (``serving``), get a whole mocker
    onto the secured bus: its card is in the registry."""
    namespace = f"tls{uuid.uuid4().hex[:8]}"
    config = MockerConfig(
        nats_url=secure_nats.url(),
        namespace=namespace,
        model_path=model_info.model_dir,
        worker_id="tls-worker",
        speedup_ratio=0.0,
        shutdown_grace_s=1.0,
        nats_tls_ca=secure_nats.ca,
        nats_tls_cert=secure_nats.client_cert,
        nats_tls_key=secure_nats.client_key,
    )
    async with (
        serving(config, "mocker", lambda nc: Mocker(config, nc, model=model_info)),
        _reader(secure_nats) as nc,
    ):
        directory = WorkerDirectory(nc.jetstream(), Subjects(namespace))
        await directory.start()
        try:
            await eventually_async(
                directory.models,
                interval_s=0.05,
                message="the worker's card never reached a reader over TLS",
            )
            assert [c.worker_id for c in directory.live(config.model_name)] == ["tls-worker"]
        finally:
            await directory.stop()


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="go together"):
        MockerConfig(nats_tls_cert=Path(__file__))
    with pytest.raises(ValueError, match="no such file"):
        MockerConfig(nats_creds=Path("/no/such.creds"))


@contextlib.asynccontextmanager
async def _reader(secure: SecureNats) -> AsyncIterator[Client]:
    """A client connection to the secured server for the test's own reads."""
    nc = await connect(secure.url(), name="tls-reader", **secure.auth().connect_options())
    try:
        yield nc
    finally:
        await nc.close()
