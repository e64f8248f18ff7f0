"""The ``hccl`` transport (``[transport] name = "hccl"``): bytes between two daemons' NPU memory by one-sided
HCCL, everything else over a tcp channel -- a one-sided transport (``transport.onesided``, the base it shares
with ``nixl``: token hello, admission, owner calls as control frames, destination extents shipped by the receiver).

Each engine has its own transport on its own NPU (``ge.exec.deviceId``), in CANN's order (docs/ascend.md, "Design"):
NPU memory is registered with HCCL per allocation (a whole pool when made, a worker's cache when imported:
``datadist_ascend.globalmem``); per link each agent sends its identity (server id = listen address, PHYSICAL device
id, device ip -- ``llm.LocalCommRes``, else ``hccl_device_ip``, else the node's hccn.conf / hccn_tool by physical id
(``transport.npu_address``) --, device port, and on an A3 its super pod and super device id -- and its registered
ranges); a device ip HCCL could only fail on is refused first (``agent.check_device_ip``); both build the same
two-rank cluster table (version 1.0; 1.2 on A3), then under one process-wide lock
``HcclCommInitClusterInfoMemConfig`` with the engine's traffic class / service level, ``HcclCommBindMem`` of every
registered range, ``HcclCommPrepare`` (seconds; ``link_retry_count`` tries). A transfer: extents cut at
registrations, ``HcclBatchPut`` / ``HcclBatchGet`` 64 descriptors per call on the link's stream, one
``aclrtSynchronizeStreamWithTimeout`` to the transfer's deadline, the stream aborted on any failure; a put then says
DONE on the channel -- HCCL tells only the initiator that a put completed, so the receiver takes the authenticated
sender's word, as CANN's own flag write does. A pull reads rows of the table the owner published to the link
(``onesided.tables``, as nixl does: no owner call), by get on a worker thread. Unlink, once Prepare has ended: abort
the stream, unbind each range, destroy the communicator, destroy the stream.

Moves NPU memory only (backend ``acl``): HCCL registers host memory only from ``aclrtMallocHost``, and
datadist's host pools are memfds; a transfer touching a HOST cache fails with ``LLM_FEATURE_NOT_ENABLED``.
Run on the simulated runtime in ``make test`` (``tests/sim``); ``make test-ascend`` on real CANN.
"""

from .agent import HcclAgent
from .transport import HcclTransport

__all__ = ["HcclTransport", "HcclAgent"]
