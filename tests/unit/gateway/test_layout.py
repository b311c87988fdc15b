"""The gateway's layout holds (decision 025): a protocol-neutral ``core/``, pure ``apis/``, thin
``http/`` and ``grpc/`` fronts, and one exchange that gives a request its bus id and deadline.

Checked over the import graph and the syntax tree, so a regression fails here, not in review.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

GATEWAY = Path(__file__).parents[3] / "services" / "gateway"
EXCHANGE = GATEWAY / "core" / "exchange.py"
BUS = GATEWAY / "core" / "bus.py"


def _modules(folder: str) -> Iterator[Path]:
    yield from sorted((GATEWAY / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _offenders(folders: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(GATEWAY)} imports {name}"
        for folder in folders
        for path in _modules(folder)
        for name in sorted(_imports(path))
        if any(name == b or name.startswith(f"{b}.") for b in banned)
    ]


def test_the_folders_exist() -> None:
    assert all((GATEWAY / f / "__init__.py").is_file() for f in ("core", "apis", "http", "grpc"))


def test_nothing_under_core_or_grpc_imports_the_http_front() -> None:
    assert _offenders(("core", "grpc"), ("services.gateway.http",)) == []


def test_the_core_imports_neither_litestar_nor_grpc() -> None:
    banned = ("litestar", "grpc", "grpc_health", "grpc_reflection", "services.gateway.grpc")
    assert _offenders(("core",), banned) == []


def test_the_api_dialects_are_pure() -> None:
    """API bytes -> Struct -> bus message and back: no I/O, no framework, no front, no core."""
    banned = (
        "asyncio",
        "nats",
        "socket",
        "litestar",
        "grpc",
        "services.gateway.core",
        "services.gateway.http",
        "services.gateway.grpc",
    )
    assert _offenders(("apis",), banned) == []


def _calls_and_deadlines(path: Path) -> Iterator[str]:
    """Calls of ``bus_id``/``reply_subject`` and computed ``deadline_ms=`` values in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("bus_id", "reply_subject"):
                yield f"{path.relative_to(GATEWAY)}:{node.lineno} calls {name}"
            for kw in node.keywords:
                if kw.arg == "deadline_ms" and not isinstance(kw.value, (ast.Name, ast.Attribute)):
                    yield f"{path.relative_to(GATEWAY)}:{node.lineno} computes deadline_ms"


def test_only_the_exchange_gives_a_request_its_bus_id_and_deadline() -> None:
    """The bus itself may address a resubmission (``Reply``); every front goes through
    ``Exchanges.envelope``."""
    found = [
        line
        for path in sorted(GATEWAY.rglob("*.py"))
        if path not in (EXCHANGE, BUS)
        for line in _calls_and_deadlines(path)
    ]
    assert found == []
    assert list(_calls_and_deadlines(EXCHANGE))  # the check sees what it looks for


def test_no_module_is_named_responses_twice() -> None:
    names = [p.stem for p in GATEWAY.rglob("*.py")]
    assert [n for n in names if "responses" in n] == ["openai_responses_api"]
