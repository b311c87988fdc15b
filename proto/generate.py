"""Generate shared/kserve/ from proto/shared/kserve/*.proto with grpcio-tools' protoc.

`make proto` runs this; tests/unit/test_proto_fresh.py runs it into a temporary folder and
compares, so the committed code cannot drift from the .proto files.
"""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = "proto"
# Relative to PROTO_DIR, which is also the import root: the generated modules import each other
# as ``shared.kserve.<name>_pb2``.
MESSAGES = ("shared/kserve/model_config.proto", "shared/kserve/grpc_service.proto")
SERVICES = ("shared/kserve/grpc_service.proto",)  # only these get a _pb2_grpc.py


def generate(out: Path) -> None:
    """Write the _pb2.py, _pb2.pyi and _pb2_grpc.py modules under ``out``; raise if protoc fails."""
    protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}"]
    out.mkdir(parents=True, exist_ok=True)
    for argv in (
        [f"--python_out={out}", f"--pyi_out={out}", *MESSAGES],
        [f"--grpc_python_out={out}", *SERVICES],
    ):
        subprocess.run([*protoc, *argv], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: the repo)")
    generate(parser.parse_args(argv).out.resolve())


if __name__ == "__main__":
    main()
