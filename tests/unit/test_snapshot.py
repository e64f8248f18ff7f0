"""``Node.snapshot``: the one read model behind the status RPCs and the metrics -- frozen, and a copy."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from datadistd.core.types import Role
from datadistd.node.node import Node
from datadistd.ops.config import Config
from tests.fakes import worker_session


def test_snapshot_is_a_frozen_copy_of_the_node() -> None:
    async def main() -> None:
        node = Node(Config())
        try:
            slot = await node.init_engine(7, Role.PROMPT, {"llm.MemPoolConfig": '{"memory_size": 1048576}'},
                                          worker_session(node))
            view = node.snapshot()
            (ev,) = view.engines
            assert (ev.engine_id, ev.cluster_id, ev.role_name, ev.caches, ev.links) == (
                int(slot.engine_id), 7, "PROMPT", 0, ())
            assert view.backend == "host" and view.transport == "tcp" and view.peer_security == "plaintext"
            assert any(p.capacity == 1 << 20 for p in ev.pools)
            (data,) = ev.listeners                       # the data plane's admission books
            assert data.kind == "data" and data.preauth == 0 and data.evicted == 0
            with pytest.raises(dataclasses.FrozenInstanceError):
                ev.caches = 5  # type: ignore[misc]
            assert node.snapshot([]).engines == ()       # a caller sees only the engines it passes
            await node.finalize_engine(slot.engine_id)
            assert view.engines == (ev,)                 # the old snapshot did not change under it
            assert node.snapshot().engines == ()
        finally:
            await node.close()

    asyncio.run(main())


def test_the_gate_counts_jobs_and_waits_bounded() -> None:
    """``executor.Gate``: every job on an engine's memory in a worker thread; finalize waits for none (bounded)."""
    import threading

    from datadistd.guard.executor import Gate, Lane, Threads

    async def main() -> None:
        gate, threads = Gate(), Threads(2, 1)
        assert await gate.drained(0.01)
        release = threading.Event()
        job = asyncio.get_running_loop().create_task(gate.run(Lane(threads, "uid 0"), release.wait, 5))
        await asyncio.sleep(0.05)
        assert gate.busy == 1 and not await gate.drained(0.05)   # still running: the wait ends on time
        release.set()
        assert await gate.drained(5) and await job is True and gate.busy == 0
        threads.shutdown()

    asyncio.run(main())
