"""Links of one engine, and the transfers that run over them.

A link is set up by the *linking* engine (``link_clusters`` on the decoder, typically) towards a
*serving* engine (one that set ``listen_ip_info``): an authenticated Peer handshake, then a data
channel of several connections, then the reverse control path (``reverse.py``). As in CANN, a
link then has two ends and **either end may pull and push** over it, single and layer-wise; the
roles of client and server say nothing about prompt and decoder. A pull asks the owner at the
other end to ``Read`` (bytes flow back over the data channel, straight into the destination), a
push asks it to ``OpenWrite`` and then streams the bytes to it. The linking end reaches the owner
through the peer's ``Peer`` service, the serving end through the reverse path; the transfer code
is the same (``_calls``). Unlinking either end tears down both. When both engines live in this
daemon the link is ``local`` and transfers are plain memory copies.

Deadlines: every transfer has ``sync_kv_timeout`` (or the call's timeout). A transfer that does not
complete by then ends with ``LLM_TIMEOUT``; one whose connection is lost before (the peer died) with
``LLM_FAILED``; one whose link was unlinked meanwhile with ``LLM_NOT_YET_LINK`` (CANN's codes:
docs/choices.md). The first two mark the link ``broken`` (later transfers: ``LLM_FAILED`` at once);
``link_clusters`` on a broken link re-establishes it.
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
    ``requester`` (pull, push), ``owner`` (serve reads and writes), ``calls`` (owner calls as frames or on the
    reverse stream), sharing the state of ``core.LinkCore``."""
