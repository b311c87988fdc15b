"""The mocker: a simulated GPU worker (vLLM-like engine, deterministic tokens, timing model)."""
