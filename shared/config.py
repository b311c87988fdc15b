"""Settings declared once, as data.

Each config dataclass field that is a setting is declared with :func:`setting`, which keeps the
dataclass default as *the* default and puts the rest (help, choices, bounds, env var overrides,
deprecated env names) in the field's metadata. :func:`settings_of` turns a config class into a
:class:`Settings` table; argparse (``from_cli``), the environment fallback, the bounds checks of
``__post_init__``, ``docs/configuration.md``, ``.env`` and ``jetserve up``'s pass-through flags
are all generated from that table.

Names, derived from the field name and the class's ``SERVICE``:

- flag: ``--<field-name>`` (``worker_ttl_s`` → ``--worker-ttl-s``); a bool is
  ``--x/--no-x``.
- env var: ``JETSERVE_<SERVICE>_<FIELD>``, a leading ``<service>_`` of the field dropped
  (router ``router_mode`` → ``JETSERVE_ROUTER_MODE``); settings every service reads the same
  way (``common=True``: NATS URL, namespace, log level and format) are ``JETSERVE_<FIELD>``.

Precedence: command line, then env var (an empty one counts as unset), then the default.

``--dump-config-to FILE`` (every service, and ``jetserve up``) writes the resolved values as JSON,
secrets redacted (:meth:`Settings.dump`): a setting marked ``secret=True`` (or named like one:
``api_key``, ``*_password``, ``*_token``…) shows ``<redacted>``, and a password or token in a
URL (``nats://user:pw@host``) too. Paths to key files are not secrets and are shown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

from shared.admission import AdmissionPolicy, load_policy
from shared.metric_names import DEFAULT_PREFIX, prefix_problem
from shared.nats_auth import NatsAuth
from shared.subjects import check_token

T = TypeVar("T")

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("auto", "json", "console")

_META_KEY = "jetserve.setting"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_KINDS: tuple[type, ...] = (bool, int, float, str, Path)
_EXPECTED: dict[type, str] = {bool: "true or false", int: "an integer", float: "a number"}
REDACTED = "<redacted>"
"""What a dump shows for a secret."""
_SECRET_NAME = re.compile(r"(^|_)(api_key|password|passwd|secret|token)$")
"""A text setting named like this is secret even if its declaration forgot to say so."""


class SettingError(ValueError):
    """A value that does not parse or is out of range; the message names the flag and env var."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of a settings table: everything needed to parse, check and document a value."""

    help: str
    name: str = ""
    """The dataclass field (and argparse ``dest``)."""
    flag: str = ""
    env: str = ""
    kind: type = str
    """``bool``, ``int``, ``float``, ``str`` or ``Path``."""
    optional: bool = False
    """``None`` is a value: an empty string on the command line means ``None``."""
    default: Any = None
    has_factory: bool = False
    """The default is computed per instance (a random id); ``default_doc`` says how."""
    default_doc: str | None = None
    choices: tuple[Any, ...] = ()
    parse: Callable[[str], Any] | None = None
    """Converter for a raw string (before ``choices``), e.g. ``str.upper``."""
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    common: bool = False
    """Read the same way by every service: env var ``JETSERVE_<FIELD>``."""
    per_instance: bool = False
    """Each replica needs its own value (instance ids): compose and ``jetserve up`` never set it."""
    aliases: tuple[str, ...] = ()
    """Deprecated env var names, read (with a warning) when ``env`` is unset."""
    also_env: tuple[str, ...] = ()
    """Other env var names read quietly when ``env`` is unset (``NATS_URL``, a common standard)."""
    secret: bool = False
    """Never shown: a dump (``--dump-config-to``) says ``<redacted>`` when it is set."""
    many: bool = False
    """A ``str`` setting whose flag takes one or more arguments (vLLM's ``--lora-modules a=x
    b=y``), joined into one value with newlines; the env var holds them joined likewise."""

    # -- parsing --------------------------------------------------------------------------------

    def convert(self, raw: str, source: str) -> Any:
        """``raw`` as this setting's type; ``SettingError`` naming ``source`` when it is not."""
        text = raw.strip()
        if self.optional and text == "":
            return None
        try:
            if self.parse is not None:
                value = self.parse(text)
            elif self.kind is bool:
                value = _parse_bool(text)
            else:
                value = self.kind(text)
        except ValueError:
            expected = _EXPECTED.get(self.kind, self.kind.__name__)
            raise SettingError(f"{source}: expected {expected}, got {raw!r}") from None
        if self.choices and value not in self.choices:
            raise SettingError(f"{source}: {raw!r} is not one of {self.choices_text()}")
        return value

    def env_value(self, environ: Mapping[str, str]) -> tuple[bool, Any]:
        """``(True, value)`` when the env var (or an alias) is set and not empty."""
        for name in (self.env, *self.also_env, *self.aliases):
            raw = environ.get(name, "")
            if raw == "":
                continue
            if name in self.aliases:
                warnings.warn(
                    f"{name} is deprecated, set {self.env} instead", FutureWarning, stacklevel=4
                )
            return True, self.convert(raw, f"{name} ({self.flag})")
        return False, None

    def check(self, value: Any) -> None:
        """Raise ``SettingError`` when ``value`` breaks this setting's choices or bounds."""
        if (problem := self.problem(value)) is not None:
            raise SettingError(f"{self.flag} ({self.env}) {problem}")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` ("must be > 0, got 0"), or ``None``."""
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"must be one of {self.choices_text()}, got {value!r}"
        if self.gt is not None and not value > self.gt:
            return f"must be > {_num(self.gt)}, got {value!r}"
        if self.ge is not None and not value >= self.ge:
            return f"must be >= {_num(self.ge)}, got {value!r}"
        if self.le is not None and not value <= self.le:
            return f"must be <= {_num(self.le)}, got {value!r}"
        return None

    # -- argparse -------------------------------------------------------------------------------

    def add_to(
        self,
        parser: argparse.ArgumentParser | argparse._ArgumentGroup,
        *,
        flag: str | None = None,
        dest: str | None = None,
        help: str | None = None,
    ) -> None:
        """Add this setting as an option whose default is "not given" (``argparse.SUPPRESS``).

        The default is applied later (env var, then the dataclass default), so ``--help`` shows
        it in the text instead of argparse's ``%(default)s``.
        """
        flag = flag or self.flag
        text = (help if help is not None else self.help_line()).replace("%", "%%")
        common: dict[str, Any] = {"dest": dest or self.name, "default": argparse.SUPPRESS}
        if self.kind is bool and not self.optional:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=text, **common)
            return
        metavar = "{" + ",".join(str(c) for c in self.choices) + "}" if self.choices else None
        if metavar is None:
            metavar = "SECONDS" if self.name.endswith("_s") else self.name.upper()
        if self.many:
            parser.add_argument(
                flag, nargs="+", action=_JoinArgs, metavar=metavar, help=text, **common
            )
            return
        parser.add_argument(
            flag, type=self._argparse_type(flag), metavar=metavar, help=text, **common
        )

    def _argparse_type(self, flag: str) -> Callable[[str], Any]:
        def convert(raw: str) -> Any:
            try:
                value = self.convert(raw, flag)
            except SettingError as exc:
                raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag}: ")) from None
            if (problem := self.problem(value)) is not None:
                raise argparse.ArgumentTypeError(problem)
            return value

        convert.__name__ = self.kind.__name__
        return convert

    def to_argv(self, value: Any, flag: str | None = None) -> list[str]:
        """Command-line arguments that give ``value`` to a service (``jetserve up``)."""
        flag = flag or self.flag
        if self.kind is bool and not self.optional:
            return [flag if value else f"--no-{flag.removeprefix('--')}"]
        return [flag, "" if value is None else str(value)]

    # -- documentation --------------------------------------------------------------------------

    def flags_text(self) -> str:
        if self.kind is bool and not self.optional:
            return f"{self.flag}, --no-{self.flag.removeprefix('--')}"
        return self.flag

    def default_text(self) -> str:
        """The default as the docs show it: ``on``/``off``, ``unset``, ``empty``, or the value."""
        if self.default_doc is not None:
            return self.default_doc
        return _show(self.default)

    def env_example(self) -> str:
        """The default as an env var value (``.env``): ``true``/``false``, empty for unset."""
        if self.default is None or self.has_factory:
            return ""
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return str(self.default)

    def choices_text(self) -> str:
        return ", ".join(str(c) for c in self.choices)

    def constraint_text(self) -> str:
        """``> 0``, ``>= 1``, ``0 to 1``: the bounds in words (empty when there are none)."""
        low = f">= {_num(self.ge)}" if self.ge is not None else ""
        low = f"> {_num(self.gt)}" if self.gt is not None else low
        if self.le is not None and self.ge is not None:
            return f"{_num(self.ge)} to {_num(self.le)}"
        if self.le is not None:
            return f"{low}, <= {_num(self.le)}" if low else f"<= {_num(self.le)}"
        return low

    def description(self) -> str:
        """The help text plus choices, bounds and other env var names, for the docs."""
        parts = [self.help]
        if self.choices:
            parts.append(f"One of: {self.choices_text()}.")
        if constraint := self.constraint_text():
            parts.append(f"Must be {constraint}.")
        if self.also_env:
            parts.append(f"Also read from {', '.join(self.also_env)}.")
        if self.aliases:
            parts.append(f"Deprecated name: {', '.join(self.aliases)}.")
        return " ".join(p if p.endswith(".") else p + "." for p in parts)

    def help_line(self) -> str:
        """``--help`` text: the help, then ``[env VAR; default X]`` as Dynamo's flags do."""
        bounds = f"; must be {c}" if (c := self.constraint_text()) else ""
        return f"{self.help} [env {self.env}; default {self.default_text()}{bounds}]"

    def shown(self, value: Any) -> Any:
        """``value`` as a dump shows it: JSON types, a set secret ``<redacted>``, a URL's
        password or token redacted."""
        if value is None or isinstance(value, bool | int | float):
            return value
        text = str(value)
        if self.secret:
            return REDACTED if text else text
        return redact_urls(text) if "@" in text else text


@dataclass(frozen=True, slots=True)
class DocRow:
    """One row of the configuration reference."""

    flag: str
    env: str
    default: str
    description: str


@dataclass(frozen=True, slots=True)
class Settings:
    """The settings table of one config class, in field order."""

    service: str
    items: tuple[Setting, ...]

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, name: str) -> Setting:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(name)

    def select(self, *names: str) -> Settings:
        return Settings(self.service, tuple(self[n] for n in names))

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """Add every setting to ``parser`` (see :meth:`Setting.add_to`)."""
        for item in self.items:
            item.add_to(parser)

    def from_env(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The values set through env vars (``SettingError`` for one that does not parse)."""
        environ = os.environ if environ is None else environ
        found: dict[str, Any] = {}
        for item in self.items:
            is_set, value = item.env_value(environ)
            if is_set:
                found[item.name] = value
        return found

    def from_args(self, args: argparse.Namespace) -> dict[str, Any]:
        """The values given on the command line (an empty one for a computed default = unset)."""
        given = vars(args)
        found: dict[str, Any] = {}
        for item in self.items:
            if item.name not in given:
                continue
            value = given[item.name]
            if item.has_factory and value == "":
                continue
            found[item.name] = value
        return found

    def values(
        self, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Command line over environment: only the values that were given somewhere."""
        cli = self.from_args(args) if args is not None else {}
        return {**self.from_env(environ), **cli}

    def resolved(
        self, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Every setting's value: given, else its default (for tables not built into a class)."""
        given = self.values(args, environ)
        return {i.name: given.get(i.name, i.default) for i in self.items}

    def check(self, config: object) -> None:
        """Check every value of ``config`` against its setting's choices and bounds."""
        for item in self.items:
            item.check(getattr(config, item.name))

    def doc_rows(self) -> list[DocRow]:
        return [
            DocRow(i.flags_text(), i.env, i.default_text(), i.description()) for i in self.items
        ]

    def env_vars(self) -> list[str]:
        return [i.env for i in self.items]

    def dump(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` (by setting name, in table order) as JSON-ready data, secrets redacted."""
        return {i.name: i.shown(values[i.name]) for i in self.items if i.name in values}


def redact_urls(text: str) -> str:
    """``text`` with the password (or the token) of each comma-separated URL redacted:
    ``nats://u:pw@h`` is ``nats://u:<redacted>@h``, ``nats://tok@h`` is ``nats://<redacted>@h``."""
    return ",".join(_redact_url(part) for part in text.split(","))


def _redact_url(text: str) -> str:
    try:
        parts = urlsplit(text.strip())
    except ValueError:
        return text
    if "@" not in parts.netloc:
        return text
    userinfo, _, host = parts.netloc.rpartition("@")
    user, has_password, _ = userinfo.partition(":")
    shown = f"{user}:{REDACTED}" if has_password else REDACTED
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def write_dump(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path`` (its folder made if missing), whole: a reader
    sees no half-written file (``OSError`` when it cannot be written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    part.replace(path)


def add_dump_option(parser: argparse.ArgumentParser) -> None:
    """``--dump-config-to FILE`` (dest ``dump_config_to``; not a setting: no env var)."""
    parser.add_argument(
        "--dump-config-to",
        type=Path,
        metavar="FILE",
        default=None,
        help="write the resolved settings (flags, env vars, defaults) to FILE as JSON, secrets "
        "redacted, then go on running",
    )


def setting(
    default: T,
    help: str,
    *,
    choices: Sequence[Any] = (),
    parse: Callable[[str], Any] | None = None,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    env: str = "",
    flag: str = "",
    common: bool = False,
    per_instance: bool = False,
    aliases: Sequence[str] = (),
    also_env: Sequence[str] = (),
    default_doc: str | None = None,
    secret: bool = False,
    many: bool = False,
) -> T:
    """A dataclass field that is a setting; ``default`` is its default (one place)."""
    meta = Setting(
        help=help,
        env=env,
        flag=flag,
        choices=tuple(choices),
        parse=parse,
        gt=gt,
        ge=ge,
        le=le,
        common=common,
        per_instance=per_instance,
        aliases=tuple(aliases),
        also_env=tuple(also_env),
        default_doc=default_doc,
        secret=secret,
        many=many,
    )
    result: T = field(default=default, metadata={_META_KEY: meta})
    return result


class _JoinArgs(argparse.Action):
    """A ``many`` setting's arguments as one value, one per line (a repeated flag adds more)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given = [values] if isinstance(values, str) else [str(v) for v in values or ()]
        before = getattr(namespace, self.dest, None)
        if isinstance(before, str) and before:
            given.insert(0, before)
        setattr(namespace, self.dest, "\n".join(given))


def computed_setting(
    factory: Callable[[], T],
    help: str,
    *,
    default_doc: str,
    env: str = "",
    per_instance: bool = False,
) -> T:
    """A setting whose default ``factory()`` computes per instance (e.g. a random id)."""
    meta = Setting(help=help, env=env, per_instance=per_instance, default_doc=default_doc)
    result: T = field(default_factory=factory, metadata={_META_KEY: meta})
    return result


def settings_of(cls: type) -> Settings:
    """The settings table of dataclass ``cls`` (its ``SERVICE`` prefixes the env vars)."""
    table = _TABLES.get(cls)
    if table is None:
        table = _TABLES[cls] = _build_table(cls)
    return table


_TABLES: dict[type, Settings] = {}
"""Built once per class (class objects never change after creation)."""


def _build_table(cls: type) -> Settings:
    service: str = getattr(cls, "SERVICE", "")
    hints = typing.get_type_hints(cls)
    items = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META_KEY)
        if not isinstance(meta, Setting):
            continue
        kind, optional = _kind(hints[f.name], f"{cls.__name__}.{f.name}")
        has_factory = f.default is dataclasses.MISSING
        items.append(
            dataclasses.replace(
                meta,
                name=f.name,
                flag=meta.flag or "--" + f.name.replace("_", "-"),
                env=meta.env or _env_name(service, f.name, common=meta.common),
                kind=kind,
                optional=optional,
                default=None if has_factory else f.default,
                has_factory=has_factory,
                secret=meta.secret or (kind is str and bool(_SECRET_NAME.search(f.name))),
            )
        )
    return Settings(service, tuple(items))


def _env_name(service: str, name: str, *, common: bool) -> str:
    if common or not service:
        return f"JETSERVE_{name.upper()}"
    return f"JETSERVE_{service.upper()}_{name.removeprefix(service + '_').upper()}"


def _kind(hint: Any, where: str) -> tuple[type, bool]:
    """``(kind, optional)`` of a field annotation such as ``float`` or ``Path | None``."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2 and rest[0] in _KINDS:
            return rest[0], True
    elif hint in _KINDS:
        return hint, False
    raise TypeError(f"{where}: a setting must be one of bool, int, float, str, Path (or | None)")


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(text)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _show(default: Any) -> str:
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None:
        return "unset"
    if default == "":
        return "empty"
    return str(default)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommonConfig:
    """Settings every service has; a service's config subclasses this and sets ``SERVICE``."""

    SERVICE: ClassVar[str] = ""
    DESCRIPTION: ClassVar[str] = ""
    NO_ECHO: ClassVar[bool] = False
    """The service never needs a message it published itself: the server does not send them
    back (``no_echo``), so its own broadcasts cost it no wake-up."""

    nats_url: str = setting(
        DEFAULT_NATS_URL,
        "NATS server URL(s), comma-separated",
        common=True,
        also_env=("NATS_URL",),
    )
    namespace: str = setting("jetserve", "Namespace prefixed to every subject", common=True)
    log_level: str = setting(
        "INFO",
        "Log level (any case)",
        choices=LOG_LEVELS,
        parse=str.upper,
        common=True,
        aliases=("LOG_LEVEL",),
    )
    log_format: str = setting(
        "auto",
        "json, console, or auto (json unless stderr is a terminal)",
        choices=LOG_FORMATS,
        common=True,
        aliases=("LOG_FORMAT",),
    )
    js_replicas: int = setting(
        1,
        "Replicas of the JetStream streams, KV buckets and object stores this service creates "
        "(3 on a 3-node NATS cluster); an existing one with fewer is scaled up, never down",
        ge=1,
        le=5,
        common=True,
    )
    nats_creds: Path | None = setting(
        None,
        "NATS .creds file (a user JWT and its NKey seed); user:password or a token go in the URL",
        common=True,
    )
    nats_nkey_seed: Path | None = setting(None, "NATS NKey seed file", common=True)
    nats_tls_ca: Path | None = setting(
        None,
        "CA certificate (PEM) that signed the NATS server's; unset = the system's",
        common=True,
    )
    nats_tls_cert: Path | None = setting(
        None, "Client certificate (PEM) for a NATS server that verifies clients", common=True
    )
    nats_tls_key: Path | None = setting(None, "The key (PEM) of --nats-tls-cert", common=True)
    admission_config: Path | None = setting(
        None,
        "Admission policy YAML: classes and weights, tenants, API keys, token budgets "
        "(shared/admission.py); gateways and routers read it, every replica the same file",
        common=True,
    )
    metrics_port: int = setting(0, "Port for Prometheus /metrics (0 = off)", ge=0, le=65535)
    metrics_prefix: str = setting(
        DEFAULT_PREFIX,
        "What every Prometheus metric name of this service starts with instead of jetserve_ "
        "(with acme_, jetserve_in_flight is served as acme_in_flight); jetserve top takes it too",
        common=True,
    )
    shutdown_grace_s: float = setting(
        10.0, "On SIGTERM, how long in-flight work may take before it is cancelled", ge=0
    )

    def __post_init__(self) -> None:
        settings = type(self).settings()
        check_token(self.namespace, f"--namespace / {settings['namespace'].env}")
        if problem := prefix_problem(self.metrics_prefix):
            raise SettingError(f"--metrics-prefix ({settings['metrics_prefix'].env}) {problem}")
        if problems := self.nats_auth().problems():
            raise SettingError("; ".join(problems))
        if self.admission_config is not None:
            try:
                load_policy(self.admission_config)
            except (OSError, ValueError) as exc:
                raise SettingError(f"--admission-config: {exc}") from exc
        settings.check(self)

    def admission_policy(self) -> AdmissionPolicy:
        """``--admission-config`` read (checked when this config was made)."""
        return load_policy(self.admission_config)

    def nats_auth(self) -> NatsAuth:
        """The NATS credential and TLS files of this config."""
        return NatsAuth(
            creds=self.nats_creds,
            nkey_seed=self.nats_nkey_seed,
            tls_ca=self.nats_tls_ca,
            tls_cert=self.nats_tls_cert,
            tls_key=self.nats_tls_key,
        )

    @classmethod
    def settings(cls) -> Settings:
        """This config's settings table."""
        return settings_of(cls)

    def dump(self) -> dict[str, Any]:
        """Every setting's value, as ``--dump-config-to`` writes it (secrets redacted)."""
        settings = type(self).settings()
        values = {item.name: getattr(self, item.name) for item in settings}
        return {"service": self.SERVICE, "settings": settings.dump(values)}

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        """The ``python -m services.<SERVICE>`` parser, generated from :meth:`settings`."""
        parser = argparse.ArgumentParser(
            prog=f"python -m services.{cls.SERVICE}",
            description=cls.DESCRIPTION or None,
            epilog="Each flag falls back to its env var (an empty one is unset), then its default.",
        )
        cls.settings().add_to(parser)
        add_dump_option(parser)
        return parser

    @classmethod
    def from_cli(
        cls, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> Self:
        """Flags (default ``sys.argv[1:]``), then env vars, then defaults; bad values exit 2.
        With ``--dump-config-to FILE`` the result is written there first (see ``dump``)."""
        parser = cls.parser()
        args = parser.parse_args(argv)
        try:
            config = cls(**cls.settings().values(args, environ))
        except ValueError as exc:  # SettingError, or a check in __post_init__
            parser.error(str(exc))
        if args.dump_config_to is not None:
            try:
                write_dump(args.dump_config_to, config.dump())
            except OSError as exc:
                parser.error(f"--dump-config-to {args.dump_config_to}: {exc.strerror or exc}")
        return config
