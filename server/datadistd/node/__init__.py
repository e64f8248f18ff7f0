"""The node: one object over the engines, their links and the worker leases; what every way in (``api/``) calls."""
