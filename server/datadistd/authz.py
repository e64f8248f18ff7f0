"""The one authorization point for link setup: who may link to an engine, and which link a new one may displace.

Every link that reaches an engine's memory from outside that engine is set up through ``links/setup.py``,
and every setup asks here first:

* **same-daemon links** (``_link_local``: memory copies, no handshake, no secret) are allowed only between
  engines whose workers run as the same uid (the kernel's word on the attach socket; an engine made
  without a session, by the daemon's own tools and tests, counts as the daemon's uid). Authenticating
  them "like remote ones" would prove nothing: the daemon holds the secret and would vouch for any
  tenant. Engines of different users in one daemon do not link; ``LLM_LINK_FAILED``.
* **remote links** authenticate by the handshake (the peer daemon proves the shared secret); every
  daemon holding it is trusted for its links (docs/security.md, threat model).
* **displacing a served link**: the serving engine keeps one link per linking cluster id (CANN). A new
  link naming a cluster id that already has one may replace it only when it comes from the same origin:
  the same linking engine of this daemon (a relink), or a peer daemon replacing a peer daemon's link (a
  restarted peer relinks before its old link times out). A same-daemon link can no longer drop a remote
  peer's link by naming its cluster id, nor a peer a same-daemon one: ``LLM_ALREADY_LINK``.

What a link may then read or write is the target engine's consent, checked in one place for every kind
of link (``Engine.prepare_read``/``prepare_write``: remotely accessible caches only). Answers to callers
that have not authenticated name no cluster or engine id (``serve_challenge``). No grpc here.
"""

from __future__ import annotations

from .core.errors import DataDistError, StatusCode

__all__ = ["authorize_local_link", "authorize_displace", "REMOTE"]

#: the origin of a link set up by a peer daemon's handshake
REMOTE = "remote"


def authorize_local_link(linking_uid: int, serving_uid: int) -> None:
    """A same-daemon link from an engine of ``linking_uid`` to one of ``serving_uid``; see the module doc."""
    if linking_uid != serving_uid:
        raise DataDistError(StatusCode.LLM_LINK_FAILED,
                            "the engine at this address belongs to another user of this daemon: engines of one "
                            "daemon link only within one user (docs/security.md, \"Links\")")


def authorize_displace(cluster_id: int, old_origin: object | None, new_origin: object) -> None:
    """A new link of ``new_origin`` (a linking engine's link manager, or ``REMOTE``) over the served link of
    ``cluster_id`` whose origin is ``old_origin`` (None: there is none)."""
    if old_origin is None or old_origin is new_origin:
        return
    raise DataDistError(StatusCode.LLM_ALREADY_LINK,
                        f"cluster {cluster_id} already has a link to this engine "
                        f"({'from a peer daemon' if old_origin is REMOTE else 'from this daemon'}); unlink it first")
