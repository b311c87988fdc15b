# JetServe tasks. `make run` and `make test` work on a fresh machine with Python 3.11:
# each creates .venv and installs what it needs first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# `docker compose` (v2 plugin), else the standalone `docker-compose` 1.x.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

.DEFAULT_GOAL := help
.PHONY: help install run test test-engines test-vllm bench-gpu _test-all test-unit test-integration test-e2e test-chaos test-compose test-containers images-local up down lint fmt typecheck proto bench bench-c1 bench-hops bench-ab bench-gateway bench-burst bench-routing bench-disagg bench-lora bench-chaos config-doc clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-18s %s\n",$$1,$$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP) ## create .venv with every service and the test tools (the Qwen3 tokenizer is fetched on first use)

run: $(STAMP) ## run JetServe: private nats-server, all services, 2 mocker workers, on :8000
	$(VENV)/bin/jetserve up $(ARGS)

test: $(STAMP) ## unit + integration + e2e + compose tests, then integration on a NATS container (what CI runs)
	@bash tests/compose/with_docker.sh $(MAKE) --no-print-directory _test-all

# Docker is there (JETSERVE_DOCKER_READY) or not (JETSERVE_DOCKER_SKIP_REASON): see with_docker.sh.
_test-all:
	$(PY) -m pytest $(PYTEST_ARGS)
	@if [ "$${JETSERVE_DOCKER_READY:-}" = 1 ]; then \
		echo "integration tests again, NATS from testcontainers (JETSERVE_TEST_NATS=container)"; \
		JETSERVE_TEST_NATS=container $(PY) -m pytest tests/integration $(PYTEST_ARGS); \
	else \
		echo "skipping the testcontainers pass: $${JETSERVE_DOCKER_SKIP_REASON:-no Docker}"; \
	fi

# The transformers engine needs torch: the CPU build (2.13.0, a 192 MB wheel where this machine
# keeps one; PyPI's default build carries CUDA libraries of several GB).
ENGINES_STAMP := $(VENV)/.engines-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
$(ENGINES_STAMP): $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.*'
	$(PY) -m pip install -q -e '.[test,hf]'
	@rm -f $(VENV)/.engines-*; touch $@

test-engines: $(ENGINES_STAMP) ## the transformers engine on CPU: the worker contract and the whole stack (installs torch's CPU build)
	JETSERVE_ENGINE_TESTS=1 $(PY) -m pytest tests/engines $(PYTEST_ARGS)

VLLM_VENV := .venv-vllm
test-vllm: ## vLLM's own classes instead of the fakes (KV event structs, ZMQ publisher, SamplingParams); own venv, several GB
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[test,vllm]'
	JETSERVE_ENGINE_TESTS=1 $(VLLM_VENV)/bin/python -m pytest tests/vllm_real tests/unit/vllm_worker $(PYTEST_ARGS)

bench-gpu: ## on a GPU host: the transformers engine alone vs behind JetServe, c=1/16/64 (bench/gpu/README.md)
	bash bench/gpu/run.sh $(ARGS)

test-unit: $(STAMP) ## pure-logic tests only (no sockets)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: $(STAMP) ## tests against a real nats-server
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: $(STAMP) ## every service as a process, driven by the openai client
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

test-chaos: $(STAMP) ## chaos suite: one fault at a time under streaming load, correctness only (times: bench-chaos), one JSON line per scenario (issue 9)
	$(PY) -m pytest tests/chaos -m chaos -s $(PYTEST_ARGS)

test-compose: $(STAMP) ## the compose test: starts dockerd and builds local images if needed
	JETSERVE_DOCKER_PROVISION=1 bash tests/compose/with_docker.sh $(PY) -m pytest tests/compose $(PYTEST_ARGS)

test-containers: $(STAMP) ## integration tests against NATS in a container (testcontainers)
	JETSERVE_DOCKER_PROVISION=1 bash tests/compose/with_docker.sh \
		env JETSERVE_TEST_NATS=container $(PY) -m pytest tests/integration $(PYTEST_ARGS)

images-local: $(STAMP) ## no registry? build python:3.11-slim, nats and jetserve images locally (starts dockerd)
	bash tests/compose/build_local_images.sh all

up: ## docker compose up -d (ARGS="--scale router=2 --scale mocker=4")
	$(COMPOSE) up -d $(ARGS)

down: ## docker compose down -v: remove containers, network and the NATS volume
	$(COMPOSE) down -v --remove-orphans

lint: $(STAMP) ## ruff (format check + lint)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

fmt: $(STAMP) ## format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP) ## mypy --strict on shared/ and services/
	$(VENV)/bin/mypy

proto: $(STAMP) ## regenerate shared/kserve/ (gRPC code, committed) from proto/shared/kserve/*.proto
	$(PY) proto/generate.py

# Where bench, bench-c1, bench-routing and bench-disagg write their JSON, PNG plots beside it (bench/plots.py, bench/disagg_plots.py).
BENCH_OUT ?= .bench/$(shell date -u +%Y-%m-%dT%H%M%SZ)

bench: $(STAMP) ## serving benchmark: c=1 and c=64 with speedup 0, HTTP and gRPC alternated; then bench-c1; JSON + plots in .bench/
	$(PY) -m bench.serving --out $(BENCH_OUT)-serving.jsonl $(ARGS)

bench-c1: $(STAMP) ## c=1 TTFT p50/p99 + CPU/request/process, JetServe vs Dynamo (../shared/bench kit) alternated, --rounds 3; JSON + plots in .bench/
	$(PY) -m bench.side_by_side --out $(BENCH_OUT)-c1.jsonl $(ARGS)

bench-ab: $(STAMP) ## interleaved A/B: two trees (DIR_A, DIR_B) or one env var (VAR, A, B), optionally Dynamo (DYN=1), all up at once
	bash bench/interleaved.sh

bench-hops: $(STAMP) ## c=1 per-hop latency budget: hop deltas, NATS messages/request by subject, CPU/process, observer on vs off
	$(PY) -m bench.hops $(ARGS)

bench-gateway: $(STAMP) ## gateway CPU per request alone: HTTP vs KServe gRPC (both clients), a stand-in pipeline
	$(PY) -m bench.gateway_cost $(ARGS)

bench-burst: $(STAMP) ## overload: gateway RSS and ok/503 at c=64, then a 10x burst (c=640); limit 128, then none
	$(PY) -m bench.burst $(ARGS)

bench-chaos: $(STAMP) ## chaos recovery times vs issue 9's bounds (ARGS="--rounds 3 --scenarios sigkill-preprocessor"); JSON lines in .bench/
	$(PY) -m bench.chaos --out $(BENCH_OUT)-chaos.jsonl $(ARGS)

bench-routing: $(STAMP) ## router benchmark: decision latency + events/s (a), shared-prefix kv vs round-robin (b); JSON + plots in .bench/
	$(PY) -m bench.routing --part a b --out $(BENCH_OUT)-routing.json $(ARGS)

bench-disagg: $(STAMP) ## 4 aggregated vs 2 prefill + 2 decode mockers (speedup 1, 4-8k-token prompts, c=16/64), JetServe vs Dynamo alternated, --rounds 2 (~15 min; --quick); JSON + plots in .bench/
	$(PY) -m bench.disagg --out $(BENCH_OUT)-disagg.jsonl $(ARGS)

bench-lora: $(STAMP) ## LoRA placement vs static holders: 4 mockers (max-loras 2), 8 adapters, Zipf demand, alternated, --rounds 2 (~2 min; --quick); tok/s + TTFT p99 table, JSON in .bench/
	$(PY) -m bench.lora --out $(BENCH_OUT)-lora.json $(ARGS)

bench-fairness: $(STAMP) ## fairness across router replicas: premium:regular 4:1, saturated mockers, 1 router vs 2 with skewed ingress (+ JetServe as 2 sites on 2 NATS nodes), JetServe vs Dynamo alternated, --rounds 2 (~15 min; --quick ~3 min); JSON in .bench/
	$(PY) -m bench.fairness --out $(BENCH_OUT)-fairness.jsonl $(ARGS)

config-doc: $(STAMP) ## regenerate docs/configuration.md and .env from the settings tables
	$(PY) -m tools.config_doc --write

.PHONY: asyncapi
asyncapi: $(STAMP) ## regenerate docs/asyncapi.json (the bus: subjects, publishers, subscribers, schemas)
	$(PY) -m shared.asyncapi > docs/asyncapi.json.tmp && mv docs/asyncapi.json.tmp docs/asyncapi.json

clean: ## remove the venv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
