"""How a service proves itself to NATS and checks the server: the ``nats.connect`` options of
the ``--nats-*`` settings every service has (``CommonConfig.nats_auth``).

- user and password, or a token: in the URL (``nats://user:pass@host:4222``,
  ``nats://token@host:4222``), as nats-py reads them;
- an NKey seed file (``--nats-nkey-seed``) or a ``.creds`` file with a user JWT and its seed
  (``--nats-creds``, decentralized auth; nsc writes them);
- TLS: ``--nats-tls-ca`` (the CA that signed the server's certificate; else the system's) and
  an optional client certificate (``--nats-tls-cert`` / ``--nats-tls-key``) for servers that
  verify clients. A ``tls://`` URL asks for TLS with the system CAs alone.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NatsAuth"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NatsAuth:
    """Credential and TLS files (each optional)."""

    creds: Path | None = None
    nkey_seed: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def problems(self) -> list[str]:
        """What is wrong with these settings (empty: nothing), one line each."""
        out = []
        if self.creds is not None and self.nkey_seed is not None:
            out.append("--nats-creds and --nats-nkey-seed: give one of them")
        if (self.tls_cert is None) != (self.tls_key is None):
            out.append("--nats-tls-cert and --nats-tls-key go together")
        for flag, path in (
            ("--nats-creds", self.creds),
            ("--nats-nkey-seed", self.nkey_seed),
            ("--nats-tls-ca", self.tls_ca),
            ("--nats-tls-cert", self.tls_cert),
            ("--nats-tls-key", self.tls_key),
        ):
            if path is not None and not path.is_file():
                out.append(f"{flag} {path}: no such file")
        return out

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (nothing when no file is set)."""
        options: dict[str, Any] = {}
        if self.creds is not None:
            options["user_credentials"] = str(self.creds)
        if self.nkey_seed is not None:
            options["nkeys_seed"] = str(self.nkey_seed)
        if self.tls_ca is not None or self.tls_cert is not None:
            context = ssl.create_default_context(
                cafile=str(self.tls_ca) if self.tls_ca is not None else None
            )
            if self.tls_cert is not None:
                key = str(self.tls_key) if self.tls_key is not None else None
                context.load_cert_chain(str(self.tls_cert), key)
            options["tls"] = context
        return options
