"""The ``nixl`` transport: KV bytes by NIXL (UCX: RDMA verbs, RoCE, shared memory, TCP; libfabric: EFA).

Set ``[transport] name = "nixl"`` on both daemons (and ``nixl_fabric_trusted = true``, below). A link
then runs on a tcp data channel exactly as with ``tcp`` -- the same token hello, admission, owner
calls as control frames, liveness -- but the KV bytes of every pull and push move by one NIXL WRITE:

1. ``connect``: after the tcp hello, the two sides swap agent name and metadata (``M`` messages in
   ``CONTROL_TRANSPORT`` frames, over the authenticated channel); each loads the other's.
2. ``expect(segments)`` (the receiving side: the puller, or the owner of a pushed-to cache):
   registers the mapped handles the segments lie in (once per handle), and sends ``D``: the
   transfer id, the extents ``(address, length)`` of the destination, and partial metadata of any
   registration this peer has not seen yet.
3. ``channel.send(transfer_id, segments)`` (the side that has the bytes): waits for that ``D``,
   pairs source and destination extents (``pairing.pair_extents``) and posts one NIXL WRITE carrying a
   notification (``DDN`` + transfer id), polled to completion; a sender that fails before posting
   sends ``F`` (transfer id, status code). A posted WRITE runs to completion (or its deadline) even
   when the link goes.
4. ``receipt.wait`` (``receipt.py``) returns when NIXL delivers the WRITE's notification, which comes
   after its bytes -- never on the sender's word; fails with the code an ``F`` carries, with
   ``LLM_LINK_FAILED`` when the channel broke and no notification came within ``QUIESCE`` (2 s),
   with ``LLM_TIMEOUT`` at the deadline.
5. ``receipt.cancel`` (a failed or timed-out transfer) sends ``X`` and waits ``QUIESCE`` for the
   sender's answer (``F``: nothing was posted; or the notification: the WRITE landed); without one it
   drops the channel and the peer's agent, so no byte lands after the memory is handed back.

Modules: ``ucx`` (loads NIXL, with the UCX settings it needs), ``agent`` (an agent: registrations, READs and
WRITEs), ``transport`` (``NixlTransport``: which agent, which label). The link machinery -- steps 1-5 above, extent
pairing, the messages, receipts -- is ``transport.onesided``'s, shared with ``hccl``.

One NIXL agent per engine, like the tcp listener: engines of one daemon share no registrations.
Only memory mapped into the daemon is registered (pools; sealed worker memory); worker memory reached
through an unsealed file cannot be registered and is refused with ``LLM_FEATURE_NOT_ENABLED``.

Trust: NIXL's backends authenticate nobody. Whoever can reach the UCX (or libfabric) endpoint and
holds the registration keys a link handed out can read or write that memory, and UCX's TCP transport
does not check keys at all. The daemon therefore starts ``nixl`` only when the operator says the
fabric is trusted (``[transport] nixl_fabric_trusted = true``) and, in docs/nixl.md, how to bind UCX
to that fabric (``UCX_NET_DEVICES``). The link handshake, tokens and owner calls stay authenticated
as on ``tcp``; only bulk bytes bypass them.

Verified here: UCX over TCP (``UCX_TLS=tcp``) and over shared memory, two daemons on one host, no
RDMA NIC. Not verified here: InfiniBand/RoCE verbs, EFA, GPU memory.
"""

from .transport import SCHEME, NixlTransport

__all__ = ["NixlTransport", "SCHEME"]
