"""Mock media worker: deterministic images (PNG) and videos (animated PNG) for the
``/v1/images/generations`` and ``/v1/videos/generations`` routes."""
