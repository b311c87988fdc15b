"""The HTTP front door: OpenAI-compatible API over NATS (``python -m services.gateway``)."""
