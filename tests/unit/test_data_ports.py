"""``[transport] data_ports`` unset while an engine serves its data plane off loopback: the daemon says so, once
(issue 44, trip 7: a firewall then stops every link at its data connection, and nothing had warned)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from datadistd.core.types import Role
from datadistd.node.node import Node
from datadistd.ops.config import Config
from tests.fakes import worker_session

POOL = {"llm.MemPoolConfig": '{"memory_size": 1048576}'}


def _warnings(host: str, data_ports: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The node's warnings naming data_ports while two engines come up with their data plane on ``host``."""
    async def main() -> None:
        node = Node(Config().with_overrides({"peer.secret": "s3cret", "transport.host": host,
                                             "transport.data_ports": data_ports}))
        try:
            for cluster in (1, 2):
                await node.init_engine(cluster, Role.DECODER, POOL, worker_session(node))
        finally:
            await node.close()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="datadistd.node.node"):
        asyncio.run(main())
    return [r.getMessage() for r in caplog.records if "data_ports" in r.getMessage()]


def test_an_engine_off_loopback_without_data_ports_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    (warning,) = _warnings("0.0.0.0", "", caplog)
    assert "0.0.0.0" in warning and "firewall" in warning and 'docs/operations.md "Ports"' in warning
    assert _warnings("0.0.0.0", "26100-26115", caplog) == []   # data_ports set
    assert _warnings("127.0.0.1", "", caplog) == []            # loopback: no other host reaches it
