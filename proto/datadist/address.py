"""The address of a local daemon, as a worker (``DATADIST_DAEMON``, the ``datadist.daemon`` option) and
``datadistctl`` (``--socket``, ``DATADIST_DAEMON``) take it: the one parser both use.

A daemon serves its workers on a unix socket only, so an address is that socket's path, plain
(``/run/datadist/datadistd.sock``) or as a gRPC target (``unix:///run/...``, ``unix:/run/...``,
``unix:relative.sock``). Nothing here imports grpc.
"""

from __future__ import annotations

__all__ = ["socket_path", "EXAMPLE"]

EXAMPLE = "/run/datadist/datadistd.sock or unix:///run/datadist/datadistd.sock"


def socket_path(address: str) -> str:
    """The socket path ``address`` names; ValueError (saying what is accepted) for another scheme or none."""
    text = address.strip()
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
    elif "://" in text:
        raise ValueError(f"datadistd serves workers on a unix socket only; got {address!r} (use {EXAMPLE})")
    else:
        path = text
    if not path:
        raise ValueError(f"no socket path in {address!r} (use {EXAMPLE})")
    return path

