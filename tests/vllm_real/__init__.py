"""Tests against a real vLLM installation (``make test-vllm``; each skips without vllm)."""
