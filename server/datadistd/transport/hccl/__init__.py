"""The ``hccl`` transport (``[transport] name = "hccl"``): bytes between two daemons' NPU memory by one-sided
HCCL, everything else over a tcp channel -- a one-sided transport (``transport.onesided``, the base it shares
with ``nixl``: token hello, admission, owner calls as control frames, destination rows shipped by the receiver).

Each engine has its own transport on its own NPU (``ge.exec.deviceId``). Per link (CANN's call order,
LLM-DataDist ``comm_entity.cc``): each engine's agent sends its identity (server id, physical device id, device
ip -- from ``llm.LocalCommRes`` or the daemon's settings); both build the same two-rank cluster table, in the
engine's device context ``HcclCommInitClusterInfoMemConfig`` with the engine's traffic class / service level,
``HcclCommBindMem`` of every registered range, ``HcclCommPrepare`` (``link_retry_count`` tries within the
prepare time). A transfer: the receiver registers its destination (``HcclRegisterGlobalMem`` + bind) and ships
the rows; the sender ``HcclBatchPut``s its rows into them on the link's stream,
``aclrtSynchronizeStreamWithTimeout`` to the transfer's deadline (aborting the stream on failure), then says
DONE on the channel -- HCCL tells only the initiator that a put completed, so the receiver takes the
authenticated sender's word, as CANN's own flag write does. Unlink: unbind, destroy.

Moves NPU memory only (backend ``acl``): HCCL registers host memory only from ``aclrtMallocHost``, and
datadist's host pools are memfds; a transfer touching a HOST cache fails with ``LLM_FEATURE_NOT_ENABLED``.
Run on the simulated runtime in ``make test`` (``tests/sim``); ``make test-ascend`` on real CANN.
"""

from .agent import HcclAgent
from .transport import HcclTransport

__all__ = ["HcclTransport", "HcclAgent"]
