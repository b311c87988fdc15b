"""Engine tests (``make test-engines``): real engines on a tiny model, alone and in the stack."""
