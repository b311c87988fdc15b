"""The integration fixtures (a real nats-server per session, a fresh namespace per test, the
weightless Qwen3 model directory) for the tests here that run a worker on the bus."""

from tests.integration.conftest import model_dir, model_info, nats_url, nc, subjects  # noqa: F401
