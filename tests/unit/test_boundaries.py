"""Services never import each other: they share only ``shared``."""

import ast
from pathlib import Path

SERVICES = Path(__file__).parents[2] / "services"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_services_import_only_shared_and_themselves() -> None:
    offenders = []
    for service in (p for p in SERVICES.iterdir() if (p / "__init__.py").is_file()):
        for path in service.rglob("*.py"):
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] == "services" and len(parts) > 1 and parts[1] != service.name:
                    offenders.append(f"{path.relative_to(SERVICES)} imports {name}")
    assert offenders == []


def test_the_launcher_loads_only_other_services_config_modules() -> None:
    """``jetserve up`` builds its pass-through flags from each service's settings table: it may
    load ``services.<name>.config`` by name, never a service's code."""
    calls = [
        node
        for path in (SERVICES / "cli").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
    ]
    dynamic = [ast.unparse(call.args[0]) for call in calls]
    assert dynamic == ["f'services.{name}.config'"]
