"""One-sided transports: KV bytes by an agent's WRITE into the peer's registered memory (a push) or READ of it
(a pull), everything else (the link manager's owner calls, the agents' metadata, destination lists, completions)
as control frames on an authenticated tcp channel. ``OneSidedTransport`` is the base both ``nixl`` and ``hccl``
derive from; each says only which agent it runs (``OneSidedAgent``) and how it is labelled.

A link runs on a tcp data channel exactly as with ``tcp`` -- the same token hello, admission, owner calls
as control frames, liveness -- but the KV bytes of every pull and push move by one WRITE:

1. ``connect``: after the tcp hello, the two sides swap agent name and metadata (``M`` messages in
   ``CONTROL_TRANSPORT`` frames, over the authenticated channel); each loads the other's.
2. ``expect(segments)`` (the receiving side): registers the handles the segments lie in (once per
   handle), and sends ``D``: the transfer id, the extents ``(address, length)`` of the destination, and
   partial metadata of any registration this peer has not seen yet.
3. ``channel.send(transfer_id, segments)`` (the side that has the bytes): waits for that ``D``, pairs
   source and destination extents (``pairing.pair_extents``) and posts one WRITE carrying a notification
   (``DDN`` + transfer id), polled to completion; a sender that fails before posting sends ``F``
   (transfer id, status code). A posted WRITE runs to completion (or its deadline) even when the link goes.
4. ``receipt.wait`` (``receipt.py``) returns when the agent delivers the WRITE's notification, which comes
   after its bytes -- never on the sender's word; fails with the code an ``F`` carries, with
   ``LLM_LINK_FAILED`` when the channel broke and no notification came within ``QUIESCE`` (2 s), with
   ``LLM_TIMEOUT`` at the deadline.
5. ``receipt.cancel`` sends ``X`` and waits ``QUIESCE`` for the sender's answer (``F``: nothing was
   posted; or the notification: the WRITE landed); without one it drops the channel and the peer's
   agent, so no byte lands after the memory is handed back.

That is a push. A pull reads (``tables.PublishedTables``, both transports; ``transport.base.ReadTables``): the link
knows its memory. The owner publishes each remotely accessible cache to every link once (``P``: a handle, its rows
and, on nixl, the partial metadata of a registration of that cache alone), updates it (``P``, next generation) and
withdraws it (``W``; nixl then deregisters its memory) before the memory can be reused; the puller prepares each
published cache's rows once and a pull is one READ of rows by index (nixl: a prepared READ, posted from the event
loop when few; hccl: ``HcclBatchGet`` on a worker thread), with a notification to the owner (``DDR``) -- no owner
call before or after. A READ that times out drops the link's channel and the peer's agent.

Modules: ``agent`` (the ``OneSidedAgent`` Protocol), ``pairing`` (the extents of both sides paired), ``wire`` (the
messages), ``receipt``, ``link`` (``LinkPeer``: the per-link state; ``OneSidedChannel``), ``transport``
(``OneSidedTransport``), ``tables`` (published tables: every pull) and ``rows`` (their arithmetic).
Threads: a progress thread per transport polls the agent's notifications; one
control thread sends destination lists that could not go out at once; tcp's reader threads deliver frames.
"""

from __future__ import annotations

from .agent import OneSidedAgent
from .link import LinkPeer, OneSidedChannel
from .receipt import OneSidedReceipt
from .tables import PublishedTables
from .transport import OneSidedTransport

__all__ = ["OneSidedAgent", "OneSidedTransport", "OneSidedChannel", "OneSidedReceipt", "LinkPeer", "PublishedTables"]
