"""Every environment variable a service reads, taken from its own ``--help`` (``env_help``).

``.env`` and ``docker-compose.yml`` must name each of them; ``test_env_file.py`` checks that,
and ``python -m tests.compose.knobs`` prints ``.env`` lines for a service to paste.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from dataclasses import dataclass

from services.formatter.config import FormatterConfig
from services.gateway.config import GatewayConfig
from services.mocker.config import MockerConfig
from services.preprocessor.config import PreprocessorConfig
from services.router.config import RouterConfig

SERVICES = {
    "gateway": GatewayConfig,
    "preprocessor": PreprocessorConfig,
    "router": RouterConfig,
    "formatter": FormatterConfig,
    "mocker": MockerConfig,
}
COMMON = ("NATS_URL", "JETSERVE_NAMESPACE", "LOG_LEVEL", "LOG_FORMAT", "JETSERVE_WORKER_TTL_S")
"""Set once for every service (``x-common-env`` in the compose file)."""
PER_INSTANCE = frozenset(
    {
        "JETSERVE_GATEWAY_ID",
        "JETSERVE_FORMATTER_ID",
        "JETSERVE_ROUTER_ID",
        "JETSERVE_MOCKER_WORKER_ID",
    }
)
"""Instance ids: each replica must pick its own, so compose never sets them."""
FIXED_IN_CONTAINER = frozenset(
    {"JETSERVE_GATEWAY_HTTP_HOST", "JETSERVE_GATEWAY_HTTP_PORT", "JETSERVE_GATEWAY_GRPC_PORT"}
)
"""Set by the compose file itself (the container side of the published ports)."""

_ENV_HELP = re.compile(r"(.*?)\s*\[env ([A-Z0-9_]+); default (.*?)\]$")


@dataclass(frozen=True)
class Knob:
    var: str
    default: str
    text: str


def service_knobs(service: str) -> list[Knob]:
    """The env vars of ``service``, in the order its ``--help`` lists them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        SERVICES[service].from_cli(["--help"])
    # argparse wraps help text: join continuation lines, then read one option per entry.
    entries = re.split(r"\n  (?=-)", out.getvalue().replace("\n" + " " * 24, " "))
    knobs = []
    for entry in entries:
        flat = " ".join(entry.split())
        if match := _ENV_HELP.search(flat):
            text = match.group(1).split("  ")[-1]
            text = re.sub(r"^--?[\w-]+( [A-Z_{},0-9.-]+)?(, --?[\w-]+( [A-Z_]+)?)? ", "", text)
            knobs.append(Knob(match.group(2), match.group(3), text))
    return knobs


def env_lines(service: str) -> list[str]:
    """``.env`` lines for the service-specific knobs: a comment, then ``#VAR=default``."""
    lines = []
    for knob in service_knobs(service):
        if knob.var in COMMON or knob.var in PER_INSTANCE or knob.var in FIXED_IN_CONTAINER:
            continue
        default = "" if knob.default == "None" else knob.default
        lines += [f"# {knob.text}", f"#{knob.var}={default}"]
    return lines


if __name__ == "__main__":
    for name in sys.argv[1:] or list(SERVICES):
        sys.stdout.write(f"# --- {name} ---\n" + "\n".join(env_lines(name)) + "\n\n")
