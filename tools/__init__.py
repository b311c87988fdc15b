"""Developer tools (not shipped): documentation generators."""
