"""The echo tensor worker: a KServe v2 tensor model whose outputs are its inputs (for testing)."""
