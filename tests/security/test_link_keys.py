"""A cluster id a caller names reaches no other origin's link, for any operation (issue 27, "What to build" 1).

An engine keeps one link per remote cluster id (CANN: transfers, unlink and check_link_status name the
remote cluster), so the table is indexed by cluster id; what makes that safe is that a cluster id names at
most one link, from one origin (``authz.authorize_displace``), and that the other end's own traffic arrives on
its link's data channel (its session), never looked up by a cluster id. In process, one daemon ``p`` with the
victim engine V (cluster 1, listening) and an impostor engine of the same uid, and a second daemon ``d``:

* D (cluster 2, on ``d``) links to V and pulls; the impostor links to V *as cluster 2*: refused
  (``LLM_ALREADY_LINK``), and neither its pulls, its unlink nor its check_link_status of cluster 1 reach
  anything (``LLM_NOT_YET_LINK``); D's link is untouched and V's check of cluster 2 reaches D's.
* V links to E (cluster 5, on ``d``); a same-daemon engine then links to V *as cluster 5*: refused, so
  once V unlinks E, V's transfers, unlink and check of cluster 5 reach nothing (before, the impostor's
  served link stood in the table beside V's own and answered as cluster 5 after V's unlink).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, CacheDesc, DType, Placement, Role
from datadistd.engine.engine import tensors_of
from datadistd.links import ClusterSpec
from datadistd.node.node import EngineSlot, Node
from datadistd.ops.config import Config
from tests.fakes import pulled, pushed, worker_session
from tests.unit.test_links import BLOCK, BLOCKS, POOL, InProcessPeer, _order

pytestmark = pytest.mark.timeout(120)

V_ADDR = ("127.0.0.1", 7101)      # V's listen address (a stand-in listener: same-daemon links find it)
OPTS = {"llm.MemPoolConfig": POOL, "llm.EnableRemoteCacheAccessible": "1"}


@dataclass
class _Listener:
    address: str

    async def stop(self) -> None:
        pass


async def _listen(host: str, port: int, slot: EngineSlot) -> _Listener:
    return _Listener(f"{host}:{port}")


def _cache(slot: EngineSlot, cluster: int, fill: int) -> int:
    entry = slot.engine.allocate_cache(CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE),
                                       is_blocks=True, blocks_key=BlocksKeyRef(cluster, 0))
    for seg in tensors_of(entry):
        seg.handle.write_from(seg.offset, memoryview(np.full(seg.length, fill, np.uint8)).cast("B"))
    return int(entry.cache_id)


async def _refused_everything(slot: EngineSlot, cluster: int, cache: int) -> None:
    """``slot``'s worker names ``cluster``: a pull, a check and an unlink all find no link."""
    for op in (pulled(slot.links, _order(cluster, cache, [1], [0])),
               pushed(slot.links, _order(cluster, cache, [1], [0])),
               slot.links.check_link(cluster)):
        with pytest.raises(DataDistError) as info:
            await op
        assert info.value.code == S.LLM_NOT_YET_LINK
    spec = ClusterSpec(cluster, *V_ADDR)
    assert await slot.links.unlink_clusters([spec], 2000, False) == (S.LLM_NOT_YET_LINK, [S.LLM_NOT_YET_LINK])


def test_a_named_cluster_id_reaches_no_other_origins_link() -> None:
    async def main() -> None:
        peers: dict[str, EngineSlot] = {}
        p = Node(Config().with_overrides({"peer.secret": "s3cret"}), listener_factory=_listen,
                 peer_connector=lambda address: InProcessPeer(peers["e"].links, address))
        d = Node(Config().with_overrides({"peer.secret": "s3cret"}),
                 peer_connector=lambda address: InProcessPeer(peers["v"].links, address))
        try:
            v = peers["v"] = await p.init_engine(1, Role.PROMPT, {**OPTS, "llm.listenIpInfo": "%s:%d" % V_ADDR},
                                                 worker_session(p))
            dec = await d.init_engine(2, Role.DECODER, OPTS, worker_session(d))
            e = peers["e"] = await d.init_engine(5, Role.PROMPT, OPTS, worker_session(d))
            v_cache = _cache(v, 1, 7)
            _cache(e, 5, 9)
            to_v = [ClusterSpec(1, *V_ADDR)]

            # 1. D's remote link to V; an impostor of this daemon names D's cluster id
            assert await dec.links.link_clusters(to_v, 3000) == (0, [0])
            theirs = v.links.served[2]
            impostor = await p.init_engine(2, Role.DECODER, OPTS, worker_session(p))
            mine = _cache(impostor, 2, 0)
            assert await impostor.links.link_clusters(to_v, 3000) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
            assert v.links.served[2] is theirs and not impostor.links.links
            await _refused_everything(impostor, 1, mine)
            dst = _cache(dec, 2, 0)
            assert (await pulled(dec.links, _order(1, dst, [1], [0])))[0] == 2 * BLOCK    # D's link still pulls
            await v.links.check_link(2)                                                  # and answers V's ping

            # 2. V's own link to E (cluster 5); a same-daemon engine names cluster 5 to V
            assert await v.links.link_clusters([ClusterSpec(5, "127.0.0.1", 7105)], 3000) == (0, [0])
            ghost = await p.init_engine(5, Role.DECODER, OPTS, worker_session(p))
            assert await ghost.links.link_clusters(to_v, 3000) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
            assert 5 not in v.links.served and not ghost.links.links
            assert await v.links.unlink_clusters([ClusterSpec(5, "127.0.0.1", 7105)], 3000, False) == (0, [0])
            await _refused_everything(v, 5, v_cache)
        finally:
            await d.close()
            await p.close()

    asyncio.run(main())
