"""The environment variables compose passes to each service, from the settings tables.

``.env`` is generated from the same tables (``make config-doc``); ``test_env_file.py`` checks it
is current and that ``docker-compose.yml`` passes each knob to its service.
``python -m tests.compose.knobs [service…]`` prints them.
"""

from __future__ import annotations

import sys

from services.cli.config import SERVICES, service_configs
from tools.env_file import common_settings, fixed_in_container, service_knobs

COMMON = tuple(s.env for s in common_settings())
"""Set once for every service (``x-common-env`` in the compose file)."""
PER_INSTANCE = frozenset(
    s.env for cls in service_configs().values() for s in cls.settings() if s.per_instance
)
"""Instance ids: each replica must pick its own, so compose never sets them."""
FIXED_IN_CONTAINER = frozenset(s.env for name in SERVICES for s in fixed_in_container(name))
"""Set by the compose file itself (the container side of the published ports)."""


def knob_vars(service: str) -> list[str]:
    """The env vars compose passes through to ``service`` from ``.env`` or the shell."""
    return [s.env for s in service_knobs(service)]


if __name__ == "__main__":
    for name in sys.argv[1:] or SERVICES:
        sys.stdout.write(f"# --- {name} ---\n" + "\n".join(knob_vars(name)) + "\n\n")
