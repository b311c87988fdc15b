"""The mock embedding worker: deterministic, unit-length vectors from token ids."""
