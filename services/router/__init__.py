"""The router: picks a live worker for each ``Generate`` and forwards it there."""
