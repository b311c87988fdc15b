"""Unit tests of the vLLM worker's pure parts (no vllm, no sockets)."""
