"""Implementations by name, loaded lazily: the one loader behind ``get_backend`` and ``get_transport``."""

from __future__ import annotations

import importlib
from typing import Any, Mapping


def load_named(kind: str, registry: Mapping[str, str], name: str, **kwargs: Any) -> Any:
    """Import ``registry[name]`` (``"module:attr"``) only now and call it; an unknown name lists the known ones."""
    try:
        target = registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(registry))}") from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)(**kwargs)
