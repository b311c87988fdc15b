"""``jetserve top --once`` output read back as tables: rows of cells by column name."""

from __future__ import annotations

import re

TITLES = frozenset({"Gateway", "Models", "Workers", "Routers", "Classes", "Tenants"})


def top_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Each titled table of ``--once`` output (cells are split on 2+ spaces)."""
    lines = text.splitlines()
    tables: dict[str, list[dict[str, str]]] = {}
    for i, line in enumerate(lines):
        if line.strip() not in TITLES:
            continue
        rest = iter(lines[i + 1 :])
        header = next(row for row in rest if row.strip())
        names = re.split(r"\s{2,}", header.strip())
        rows = []
        for row in rest:
            if "─" in row:
                continue
            if not row.strip():
                break
            rows.append(dict(zip(names, re.split(r"\s{2,}", row.strip()), strict=True)))
        tables[line.strip()] = rows
    return tables
