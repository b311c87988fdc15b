"""Preprocessor: chat template + tokenization + context checks, between gateway and router."""
