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
* **displacing a link**: an engine keeps one link per remote cluster id, whichever end set it up (CANN's
  one entity per cluster). A new served link naming a cluster id the engine already has a link with may
  replace it only when it comes from the same origin: the same linking engine of this daemon (a relink),
  or a peer daemon replacing a peer daemon's link (a restarted peer relinks before its old link times
  out). A link the engine set up itself (``OWN``) is never displaced nor shadowed by one set up to it. A
  same-daemon link cannot drop a remote peer's link by naming its cluster id, nor a peer a same-daemon
  one, nor anyone stand in for the engine's own link: ``LLM_ALREADY_LINK``. With at most one link per
  cluster id, each from one origin, a cluster id names exactly one origin's link for every operation of
  the engine's worker (transfers, unlink, check_link_status); what the other end does arrives on its own
  link's data channel (its session's token), never looked up by a cluster id (docs/security.md, "Links").

What a link may then read or write is the target engine's consent, checked in one place for every kind
of link (``Engine.prepare_read``/``prepare_write``: remotely accessible caches only). Answers to callers
that have not authenticated name no cluster or engine id (``serve_challenge``). No grpc here.
"""

from __future__ import annotations

from ..core.errors import DataDistError, StatusCode

__all__ = ["authorize_local_link", "authorize_displace", "REMOTE", "OWN"]

#: the origin of a link set up by a peer daemon's handshake
REMOTE = "remote"
#: the origin of a link the engine set up itself (its linking end): no served link may stand beside it
OWN = "own"


def authorize_local_link(linking_uid: int, serving_uid: int) -> None:
    """A same-daemon link from an engine of ``linking_uid`` to one of ``serving_uid``; see the module doc."""
    if linking_uid != serving_uid:
        raise DataDistError(StatusCode.LLM_LINK_FAILED,
                            "the engine at this address belongs to another user of this daemon: engines of one "
                            "daemon link only within one user (docs/security.md, \"Links\")")


def authorize_displace(cluster_id: int, old_origin: object | None, new_origin: object) -> None:
    """A new served link of ``new_origin`` (a linking engine's link manager, or ``REMOTE``) naming ``cluster_id``,
    with which the engine has a link of ``old_origin`` (``OWN``: one it set up; None: none)."""
    if old_origin is None or (old_origin is new_origin and old_origin is not OWN):
        return
    if old_origin is OWN:
        raise DataDistError(StatusCode.LLM_ALREADY_LINK,
                            f"this engine has its own link to cluster {cluster_id}; one link per cluster pair")
    raise DataDistError(StatusCode.LLM_ALREADY_LINK,
                        f"cluster {cluster_id} already has a link to this engine "
                        f"({'from a peer daemon' if old_origin is REMOTE else 'from this daemon'}); unlink it first")
