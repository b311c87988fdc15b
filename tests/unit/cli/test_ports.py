"""Free ports for a stack's listeners are picked together, so no two of them are the same."""

from __future__ import annotations

from services.cli.stack import free_ports, port_is_free


def test_ports_picked_together_are_all_different_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert all(port_is_free(p) for p in ports)
