"""The admission policy file (``--admission-config``, YAML): classes, tenants, API keys, budgets.

One file, read by every gateway (which resolves a request's class and tenant) and every router
(which queues by class and enforces the tenants' token budgets)::

    default_class: regular
    quantum_tokens: 512          # deficit round robin: uncached prompt tokens per weight unit
    class_header: false          # may x-dynamo-meta-policy-class pick any class?
    classes:
      premium: {weight: 4}
      regular: {weight: 1}
    tenants:
      acme: {class: premium, tokens_per_minute: 200000, classes: [premium, regular]}
      "*": {tokens_per_minute: 50000}   # every tenant not listed, each on its own
    api_keys:
      sk-acme-1: acme            # a key's requests belong to its tenant

A request's tenant is its API key's, else its ``x-tenant-id``; its class is the one named by
``x-dynamo-meta-policy-class`` where that is allowed (``class_header``, or the tenant's
``classes``), else its tenant's, else ``default_class``. A token budget counts prompt and output
tokens per rolling minute (decision 026). Pure: text in, a policy out.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import msgspec.yaml

from shared.errors import InvalidRequest

DEFAULT_CLASS = "default"
DEFAULT_QUANTUM_TOKENS = 512
ANY_TENANT = "*"
MAX_NAME_LEN = 128
CLASS_HEADER = "x-dynamo-meta-policy-class"


class PolicyClass(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    weight: float = 1.0
    """Its share of the capacity, relative to the other classes' (deficit round robin)."""


class Tenant(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename={"cls": "class"}):
    cls: str | None = None
    """The tenant's class (``None``: ``default_class``)."""
    tokens_per_minute: int | None = None
    """Prompt + output tokens per rolling minute, across every replica (``None``: no budget)."""
    classes: tuple[str, ...] = ()
    """Classes ``x-dynamo-meta-policy-class`` may pick for this tenant's requests."""


class AdmissionPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    classes: dict[str, PolicyClass] = msgspec.field(
        default_factory=lambda: {DEFAULT_CLASS: PolicyClass()}
    )
    default_class: str = DEFAULT_CLASS
    quantum_tokens: int = DEFAULT_QUANTUM_TOKENS
    class_header: bool = False
    tenants: dict[str, Tenant] = msgspec.field(default_factory=dict)
    api_keys: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("; ".join(problems))

    def _problems(self) -> list[str]:
        found = []
        if not self.classes:
            found.append("classes: at least one class")
        for name, cls in self.classes.items():
            if not 0 < len(name) <= MAX_NAME_LEN:
                found.append(f"classes: the name {name!r} must have 1-{MAX_NAME_LEN} characters")
            if not cls.weight > 0:
                found.append(f"classes.{name}.weight must be > 0")
        if self.default_class not in self.classes:
            found.append(f"default_class {self.default_class!r} is not in classes")
        if self.quantum_tokens < 1:
            found.append("quantum_tokens must be >= 1")
        for name, tenant in self.tenants.items():
            found.extend(
                f"tenants.{name}: class {cls!r} is not in classes"
                for cls in (tenant.cls, *tenant.classes)
                if cls is not None and cls not in self.classes
            )
            if tenant.tokens_per_minute is not None and tenant.tokens_per_minute < 1:
                found.append(f"tenants.{name}.tokens_per_minute must be >= 1")
        for key, tenant_name in self.api_keys.items():
            if tenant_name not in self.tenants:
                found.append(f"api_keys: a key's tenant {tenant_name!r} is not in tenants")
            if not key:
                found.append("api_keys: an empty key")
        return found

    # --- what a request gets --------------------------------------------------------------------
    def tenant_of(self, api_key: str | None, tenant_header: str | None) -> str | None:
        """The API key's tenant, else the ``x-tenant-id`` header's."""
        if api_key is not None and (tenant := self.api_keys.get(api_key)) is not None:
            return tenant
        return tenant_header

    def settings_of(self, tenant: str | None) -> Tenant | None:
        if tenant is None:
            return None
        return self.tenants.get(tenant) or self.tenants.get(ANY_TENANT)

    def class_of(self, tenant: str | None, header: str | None) -> str:
        """The request's class; a header naming an unknown class, or one this tenant may not
        pick, is a 400 naming the header."""
        settings = self.settings_of(tenant)
        if header is not None:
            if header not in self.classes:
                known = ", ".join(sorted(self.classes))
                raise InvalidRequest(
                    f"`{CLASS_HEADER}` names an unknown policy class {header!r} (known: {known})",
                    param=CLASS_HEADER,
                )
            if self.class_header or (settings is not None and header in settings.classes):
                return header
            raise InvalidRequest(
                f"`{CLASS_HEADER}`: policy class {header!r} may not be picked by this client",
                param=CLASS_HEADER,
            )
        if settings is not None and settings.cls is not None:
            return settings.cls
        return self.default_class

    def weight(self, policy_class: str) -> float:
        cls = self.classes.get(policy_class)
        return cls.weight if cls is not None else self.classes[self.default_class].weight

    def budget(self, tenant: str | None) -> int | None:
        """The tenant's tokens per minute (``None``: unlimited)."""
        settings = self.settings_of(tenant)
        return settings.tokens_per_minute if settings is not None else None


DEFAULT_POLICY = AdmissionPolicy()
"""No file: one class, no tenant budgets."""


def load_policy(path: Path | None) -> AdmissionPolicy:
    """Read and check ``--admission-config`` (``None``: the default policy); a bad file raises
    ``ValueError`` naming the problem."""
    if path is None:
        return DEFAULT_POLICY
    try:
        return msgspec.yaml.decode(path.read_bytes(), type=AdmissionPolicy)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
