"""Links of one engine, and the transfers that run over them.

A link is set up by the *linking* engine (``link_clusters`` on the decoder, typically) towards a
*serving* engine (one that set ``listen_ip_info``): an authenticated Peer handshake, then a data
channel of several connections. After the handshake that channel is the only conversation between
the two daemons: as in CANN, a link has two ends and **either end may pull and push** over it,
single and layer-wise (the roles of client and server say nothing about prompt and decoder). A pull
asks the owner at the other end to ``read`` (bytes flow back over the data channel, straight into
the destination), a push asks it to ``open_write`` and then streams the bytes to it; these owner
calls, unlink and the heartbeat are CALL/REPLY frames on the same channel (``ownercalls``), the
same from either end. Unlinking either end tears down both. When both engines live in this daemon
the link is ``local`` and transfers are plain memory copies.

Deadlines: every transfer has ``sync_kv_timeout`` (or the call's timeout); a peer that is
unreachable or breaks mid-transfer ends the call with ``LLM_TIMEOUT`` (CANN's "the link is
unrecoverable, re-link" code) and marks the link ``broken``; ``link_clusters`` on a broken link
re-establishes it.
"""

from __future__ import annotations

from .calls import OwnerCalls
from .model import (
    MAX_CLUSTERS_PER_CALL,
    ClusterSpec,
    InboundLink,
    Link,
    LinkState,
    LocalLink,
    NodeContext,
    OutboundLink,
)
from .owner import Owner
from .requester import Requester
from .setup import LinkSetup

__all__ = ["LinkManager", "Link", "OutboundLink", "InboundLink", "LocalLink", "LinkState", "ClusterSpec",
           "NodeContext", "MAX_CLUSTERS_PER_CALL"]


class LinkManager(LinkSetup, Requester, Owner, OwnerCalls):
    """The links of one engine and the transfers over them: ``setup`` (link, unlink, handshake, heartbeat),
    ``requester`` (pull, push), ``owner`` (serve reads and writes), ``calls`` (owner calls as data-channel
    frames), sharing the state of ``core.LinkCore``."""
