"""Transfers in continuation frames (issue 44, attack 4): what a worker can make the daemon hold while it
assembles one. The engine's owner is checked at the first frame (another session's engine is refused at once, with
the refusal a whole frame gets, word for word); the numbers a transfer announces are booked to the caller's uid
(``[quota] assembly_bytes_per_uid``) before a continuation is taken, and given back when the transfer is whole or
its connection drops mid-assembly."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time

import pytest

from datadist import fastframe as ff
from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2
from datadistd.api.attach import AttachServer
from datadistd.core.types import Role
from datadistd.node.node import Node
from datadistd.ops.config import Config
from tests.daemonproc import DaemonProcess
from tests.reliability.common import wait_until

from .test_attach_frames import NO_CACHE, _first_and_rest, _nothing_waiting, ask, frame, owning_attach
from .test_local import Worker

pytestmark = pytest.mark.integration

NUMBERS = 2 * 9000     # what ``_first_and_rest`` announces: 9,000 remote and 9,000 local block numbers


def replies(s: socket.socket, n: int) -> dict[int, ff.FrameReply]:
    """The next ``n`` replies on ``s``, by request id (one each)."""
    got = [ff.decode_reply(s.recv(1 << 16)) for _ in range(n)]
    assert len({r.request_id for r in got}) == n, got
    return {r.request_id: r for r in got}


def test_another_sessions_engine_is_refused_at_the_first_frame(daemon):
    """The first frame of a transfer naming another worker's engine is answered at once with what a whole frame
    gets (LLM_ENGINE_FINALIZED, word for word): a message right after the first frame is served, where before it
    made 'another message between one transfer's frames' (the owner was checked only once every frame had come);
    the rest of a refused transfer's frames are dropped unanswered."""
    victim = Worker(daemon)
    s, own, grpc_side = owning_attach(daemon)
    try:
        engine = victim.init(1)
        whole = ask(s, ff.encode_request(20, frame(engine)))
        assert whole.status == LLMStatusCode.LLM_ENGINE_FINALIZED
        served = ask(s, ff.encode_request(19, frame(own)))        # its own engine: past the owner, to the cache
        assert served.status != LLMStatusCode.LLM_ENGINE_FINALIZED
        for op in (ff.PULL, ff.PUSH):
            s.send(_first_and_rest(21, engine, op=op)[0])          # the first frame alone ...
            s.send(ff.encode_request(22, frame(own)))
            got = replies(s, 2)
            assert (got[21].status, got[21].message) == (whole.status, whole.message), got[21]
            assert (got[22].status, got[22].message) == (served.status, served.message), got[22]
            first, *rest = _first_and_rest(23, engine, op=op)
            for one in (first, *rest, ff.encode_request(24, frame(own))):   # ... and a whole refused transfer
                s.send(one)
            got = replies(s, 2)
            assert (got[23].status, got[23].message) == (whole.status, whole.message), got[23]
            assert (got[24].status, got[24].message) == (served.status, served.message), got[24]
            assert _nothing_waiting(s)
    finally:
        s.close()
        grpc_side.close()
        victim.close()
    assert daemon.proc.poll() is None


@pytest.fixture
def small_quota_daemon():
    """A daemon whose uid quota for assembly is one transfer of ``NUMBERS`` block numbers."""
    d = DaemonProcess("assembly", env={"DATADISTD_QUOTA_ASSEMBLY_BYTES_PER_UID": str(8 * NUMBERS)})
    d.start()
    yield d
    d.stop()
    d.discard()


def test_a_uid_over_its_assembly_quota_is_refused_and_a_dropped_connection_gives_its_share_back(
        small_quota_daemon):
    """Two connections of one uid, each with its engine, under a quota of one transfer: while the first assembles,
    the second's first frame gets LLM_OUT_OF_MEMORY naming the key; the first connection closes mid-assembly and
    the second's transfer is then taken (its one answer is the transfer's own, not the quota's)."""
    d = small_quota_daemon
    a, engine_a, grpc_a = owning_attach(d)
    b, engine_b, grpc_b = owning_attach(d)
    rids = iter(range(32, 1 << 30))

    def attempt() -> ff.FrameReply:
        """A transfer of ``b`` in continuation frames, then a marker frame: the transfer's one answer (the quota's
        comes at its first frame and its continuations are dropped; else the transfer's own, once all are in)."""
        rid, marker = next(rids), next(rids)
        for one in (*_first_and_rest(rid, engine_b), ff.encode_request(marker, frame(engine_b))):
            b.send(one)
        return replies(b, 2)[rid]

    answers: list[ff.FrameReply] = []

    def answered(refused: bool) -> bool:
        answers.append(attempt())
        return (answers[-1].status == LLMStatusCode.LLM_OUT_OF_MEMORY) == refused

    try:
        a.send(_first_and_rest(30, engine_a)[0])          # booked; its continuations never come
        # the two connections are read by different threads: b's transfers go through until a's first frame is in
        assert wait_until(lambda: answered(refused=True), 20), answers[-1]
        assert "[quota] assembly_bytes_per_uid" in answers[-1].message, answers[-1]
        a.close()                                          # mid-assembly: its share goes back with the connection
        assert wait_until(lambda: answered(refused=False), 20), answers[-1]
        assert answers[-1].message == NO_CACHE             # taken, assembled, and past the owner's check
        assert _nothing_waiting(b)
    finally:
        a.close()
        b.close()
        grpc_a.close()
        grpc_b.close()
    assert d.proc.poll() is None


def test_assembly_memory_is_booked_at_the_first_frame_and_given_back_when_the_connection_drops(tmp_path):
    """In process: the uid's book shows the announced numbers' bytes once the first frame is in, nothing once the
    transfer is whole, and nothing once a connection that dropped mid-assembly is gone."""
    async def main() -> None:
        node = Node(Config())
        path = os.path.join(tempfile.mkdtemp(dir=tmp_path), "d.attach")
        server = AttachServer(node, path)
        await server.start()
        loop = asyncio.get_running_loop()
        uid = os.getuid()

        async def until(predicate, what: str) -> None:  # noqa: ANN001
            deadline = time.monotonic() + 10
            while not predicate():
                assert time.monotonic() < deadline, f"{what}: {node.quota.used(uid)}"
                await asyncio.sleep(0.01)

        def booked() -> int:
            return node.quota.used(uid).get("assembly_bytes", 0)

        async def connect() -> tuple[socket.socket, int]:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.setblocking(False)
            await loop.sock_connect(s, path)
            await loop.sock_sendall(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
                protocol_version=4)).SerializeToString())
            assert attach_pb2.AttachReply.FromString(await loop.sock_recv(s, 1 << 16)).welcome.capability
            conn = next(c for c in server._conns.values() if c.greeted and not c.session.engines)
            slot = await node.init_engine(1, Role.DECODER, {}, conn.session)
            return s, int(slot.engine.engine_id)

        s, engine = await connect()
        try:
            first, *rest = _first_and_rest(40, engine)
            await loop.sock_sendall(s, first)
            await until(lambda: booked() == 8 * NUMBERS, "the first frame booked its numbers")
            for more in rest:
                await loop.sock_sendall(s, more)
            reply = ff.decode_reply(await asyncio.wait_for(loop.sock_recv(s, 1 << 16), 30))
            assert reply.request_id == 40 and reply.status != LLMStatusCode.LLM_OUT_OF_MEMORY
            assert booked() == 0                          # whole: given back before it was started

            await loop.sock_sendall(s, _first_and_rest(41, engine)[0])
            await until(lambda: booked() == 8 * NUMBERS, "the next transfer's first frame booked")
        finally:
            s.close()                                      # mid-assembly
        try:
            await until(lambda: booked() == 0, "the dropped connection gave its numbers back")
            assert not server._conns
        finally:
            await server.stop()
            await node.close()

    asyncio.run(main())
