"""The peer listener's admission front (``datadistd.api.grpc.front``) keeps no periodic timer: its sweeper, which
closes pre-auth connections at their deadline, sleeps while no connection waits for one."""

from __future__ import annotations

import asyncio

import pytest

from datadistd.api.grpc.front import PeerFront
from datadistd.guard.admission import AdmissionLimits

pytestmark = pytest.mark.timeout(30)


def test_the_front_sweeps_only_while_a_connection_waits_for_its_deadline() -> None:
    """No round while nobody is connected (before: one a second for the daemon's life); a stranger that sends
    nothing wakes it and is closed at its pre-auth deadline; then it sleeps again."""
    async def main() -> None:
        inner = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)   # the private side: holds on
        front = PeerFront(inner.sockets[0].getsockname()[1], AdmissionLimits(preauth_seconds=0.5))
        await front.start("127.0.0.1", 0)
        try:
            await asyncio.sleep(1.2)
            assert front.sweeps == 0
            reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
            try:
                got = await asyncio.wait_for(reader.read(1), 5)
            except ConnectionResetError:
                got = b""
            finally:
                writer.close()
            assert got == b""                        # closed at its deadline, by a round of the sweeper
            assert front.sweeps >= 1 and front.admission.stats()["expired"] == 1
            rounds = front.sweeps
            await asyncio.sleep(1.2)
            assert front.sweeps == rounds
        finally:
            await front.stop()
            inner.close()
            await inner.wait_closed()

    asyncio.run(main())
