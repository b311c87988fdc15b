"""The HTTP front: the raw-ASGI relay for inference, Litestar for the rest, error dialects."""
