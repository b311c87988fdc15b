"""JetServe services; each runs as ``python -m services.<name>`` and imports only ``shared``."""
