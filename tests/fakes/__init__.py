"""Fakes of external engines that follow their real interfaces (for tests that run without them)."""
