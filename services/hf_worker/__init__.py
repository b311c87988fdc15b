"""The transformers worker: real forward passes through transformers' continuous batching (a paged
KV cache), token in, token out, behind the shared worker contract (``shared.worker``).

Importing this package (or its config) needs neither torch nor transformers: only
``services.hf_worker.model`` and ``services.hf_worker.engine`` import them, lazily.
"""
