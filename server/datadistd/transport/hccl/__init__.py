"""The ``hccl`` transport (``[transport] name = "hccl"``): bytes between two daemons' NPU memory by one-sided
HCCL, everything else over a tcp channel -- the shape of the ``nixl`` transport, whose machinery it reuses
(token hello, admission, owner calls as control frames, destination rows shipped by the receiver).

Per link (CANN's call order, LLM-DataDist ``comm_entity.cc``): each daemon's agent sends its identity (server
id, physical device id, device ip); both build the same two-rank cluster table, ``HcclCommInitClusterInfoMem
Config`` with the configured traffic class / service level, ``HcclCommBindMem`` of every registered range,
``HcclCommPrepare`` (``link_retry_count`` tries within the prepare time). A transfer: the receiver registers
its destination (``HcclRegisterGlobalMem`` + bind) and ships the rows; the sender ``HcclBatchPut``s its rows
into them on the link's stream, ``aclrtSynchronizeStreamWithTimeout`` to the transfer's deadline (aborting the
stream on failure), then says DONE on the channel -- HCCL tells only the initiator that a put completed, so
the receiver takes the authenticated sender's word, as CANN's own flag write does. Unlink: unbind, destroy.

Moves NPU memory only (backend ``acl``): HCCL registers host memory only from ``aclrtMallocHost``, and
datadist's host pools are memfds; a transfer touching a HOST cache fails with ``LLM_FEATURE_NOT_ENABLED``.
Run on the simulated runtime in ``make test`` (``tests/sim``); ``make test-ascend`` on real CANN.
"""

from .agent import HcclAgent
from .transport import HcclTransport

__all__ = ["HcclTransport", "HcclAgent"]
