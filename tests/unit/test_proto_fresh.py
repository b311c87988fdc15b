"""The committed gRPC code in shared/kserve/ is what protoc makes of proto/ today."""

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).parents[2]
GENERATED = "shared/kserve"


def _generated(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / GENERATED).glob("*_pb2*.py*"))}


def test_committed_code_matches_the_proto_files(tmp_path: Path) -> None:
    generate = [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)]
    result = subprocess.run(generate, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"proto/generate.py failed:\n{result.stderr}"
    fresh, committed = _generated(tmp_path), _generated(ROOT)
    assert fresh, "proto/generate.py wrote nothing"
    stale = sorted(
        name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name)
    )
    assert not stale, (
        f"{GENERATED}/ is stale ({', '.join(stale)}): run `make proto` and commit. "
        f"(protoc here is grpcio-tools {version('grpcio-tools')}; pyproject.toml pins the one "
        "the committed code was made with)"
    )
