"""The node: one object over the engines, their links and the worker sessions; what every way in (``api/``) calls."""
