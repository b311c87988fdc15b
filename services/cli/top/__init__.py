"""``jetserve top``: a live terminal view of the fleet, fed from the bus and ``/metrics``.

``stats`` (Prometheus text, windows, quantiles) and ``events`` (bus messages kept per worker,
router, policy class and tenant) feed ``frame``, the pure model of one screen (with ``gateway``
and ``admission``, its parts from those services); ``feed`` subscribes and scrapes; ``view``
draws a frame with rich; ``command`` is the subcommand.
"""
