"""The worker's attach connection (``llm_datadist._attach``) against a scripted daemon: callers read for each other
(no reader thread per reply), every reply reaches its own caller, a stopping daemon is logged with nobody calling
and fails waiting callers with LLM_FAILED, deadlines give LLM_TIMEOUT, block lists past one datagram go as
continuation frames; a lone caller (the transfer fast path: no waiter) hands the replies of calls that came
meanwhile over, descriptors included, and fails with LLM_FAILED at a hang-up; a daemon below protocol 4 fails the
attach."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from typing import Callable

import pytest

from datadist import fastframe as ff
from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2
from llm_datadist._attach import AttachClient
from llm_datadist.status import LLMException

#: Python calls of one transfer in this module and the frame module: the lone caller's, a waiting caller's
LONE_CALLS, WAITING_CALLS = 5, 6
FRAME = ff.TransferFrame(ff.PULL, 1, ff.KIND_BLOCKS, ff.KEY_BLOCKS, (2, 0, 0, 0), 3, (4,), (5,))


class FakeDaemon:
    """One attach connection: answers hello with ``protocol``, then hands every request to the test (``requests``)
    and sends what the test asks (``answer``)."""

    def __init__(self, tmp: str, protocol: int = 4) -> None:
        self.path = os.path.join(tmp, "d.sock")
        self.protocol = protocol
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.path + ".attach")
        self.listener.listen(1)
        self.requests: queue.Queue[bytes] = queue.Queue()
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def target(self) -> str:
        return "unix:" + self.path

    def _serve(self) -> None:
        self.conn, _ = self.listener.accept()
        hello = attach_pb2.AttachRequest.FromString(self.conn.recv(1 << 16))
        self.conn.send(attach_pb2.AttachReply(request_id=hello.request_id, welcome=attach_pb2.Welcome(
            capability=b"c" * 32, protocol_version=self.protocol)).SerializeToString())
        while True:
            try:
                data = self.conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            self.requests.put(data)

    def take(self, n: int) -> list[bytes]:
        return [self.requests.get(timeout=10) for _ in range(n)]

    def answer(self, request: bytes, status: int = 0, nbytes: int = 4096) -> None:
        assert self.conn is not None
        rid = ff.decode_request(request)[0]
        self.conn.send(ff.encode_reply(rid, status, nbytes, "tcp", "no" if status else ""))

    def hang_up(self) -> None:
        assert self.conn is not None
        self.conn.shutdown(socket.SHUT_RDWR)     # (a close alone would wait for our own reader's recv)
        self.conn.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


@pytest.fixture
def daemon(tmp_path):  # noqa: ANN001, ANN201
    d = FakeDaemon(str(tmp_path))
    yield d
    d.close()


def in_threads(n: int, fn: Callable[[int], object]) -> tuple[list[threading.Thread], dict[int, object]]:
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out[i] = exc
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, out


def test_every_reply_reaches_its_own_caller_in_any_order_with_no_thread_per_call(daemon):
    client = AttachClient(daemon.target)
    try:
        assert client.protocol == 4
        before = threading.active_count()
        threads, out = in_threads(16, lambda i: client.transfer(FRAME._replace(local_cache_id=i), "pull_blocks", 30))
        requests = daemon.take(16)
        assert threading.active_count() == before + 16        # the callers; nobody reads for them in a thread
        for request in reversed(requests):                    # answered in reverse: most go to a follower
            daemon.answer(request, nbytes=1000 + ff.decode_request(request)[1].local_cache_id)
        for t in threads:
            t.join(10)
        assert out == {i: (1000 + i, "tcp") for i in range(16)}
        assert client._pending == {} and not client._reading
    finally:
        client.close()


def test_a_daemon_below_attach_protocol_4_fails_the_attach(tmp_path):
    """A daemon whose welcome says protocol 3 takes no continuation frames: the attach fails with LLM_FAILED
    saying so (there is no second way to send a transfer), and the connection is closed."""
    old = FakeDaemon(str(tmp_path), protocol=3)
    try:
        with pytest.raises(LLMException) as err:
            AttachClient(old.target)
        assert err.value.status_code == LLMStatusCode.LLM_FAILED
        assert "attach protocol 3, this client 4: update datadistd" in str(err.value)
    finally:
        old.close()


def test_a_refused_transfer_raises_its_status(daemon):
    client = AttachClient(daemon.target)
    try:
        threads, out = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        daemon.answer(daemon.take(1)[0], status=int(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST))
        threads[0].join(10)
        err = out[0]
        assert isinstance(err, LLMException) and err.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
        assert "[pull_blocks] failed" in str(err) and "no" in str(err)
    finally:
        client.close()


def test_a_caller_past_its_deadline_times_out_and_a_waiting_caller_takes_over_reading(daemon):
    client = AttachClient(daemon.target)
    try:
        short, out_short = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 0.5))
        first = daemon.take(1)[0]
        long, out_long = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        second = daemon.take(1)[0]
        short[0].join(10)
        err = out_short[0]
        assert isinstance(err, LLMException) and err.status_code == LLMStatusCode.LLM_TIMEOUT
        daemon.answer(first)             # late: nobody waits for it any more
        daemon.answer(second)
        long[0].join(10)
        assert out_long[0] == (4096, "tcp")
        assert client._pending == {}
    finally:
        client.close()


def test_a_daemon_that_stops_is_logged_with_nobody_calling(daemon, caplog):
    client = AttachClient(daemon.target)
    try:
        with caplog.at_level(logging.WARNING, logger="llm_datadist._attach"):
            daemon.hang_up()
            client._watcher.join(10)       # the watcher saw the hang-up, logged it and ended
            assert not client._watcher.is_alive()
        assert "is gone (it stopped or died): this engine and its caches are released" in caplog.text
        with pytest.raises(LLMException) as info:
            client.transfer(FRAME, "pull_blocks", 30)
        assert info.value.status_code == LLMStatusCode.LLM_FAILED
    finally:
        client.close()


def test_callers_waiting_when_the_daemon_stops_fail_with_llm_failed(daemon, caplog):
    client = AttachClient(daemon.target)
    try:
        with caplog.at_level(logging.WARNING, logger="llm_datadist._attach"):
            threads, out = in_threads(8, lambda i: client.transfer(FRAME, "pull_blocks", 60))
            requests = daemon.take(8)
            daemon.answer(requests[3])       # one is answered before the daemon goes
            daemon.hang_up()
            for t in threads:
                t.join(30)
        assert not any(t.is_alive() for t in threads)
        answered = [r for r in out.values() if r == (4096, "tcp")]
        failed = [r for r in out.values() if isinstance(r, LLMException)]
        assert len(answered) == 1 and len(failed) == 7
        assert {e.status_code for e in failed} == {LLMStatusCode.LLM_FAILED}
        assert caplog.text.count("is gone") == 1
    finally:
        client.close()


def test_close_logs_nothing_and_fails_nobody_twice(daemon, caplog):
    client = AttachClient(daemon.target)
    with caplog.at_level(logging.WARNING, logger="llm_datadist._attach"):
        client.close()
    assert not client._watcher.is_alive()
    assert "is gone" not in caplog.text


def test_block_lists_past_one_datagram_go_as_a_first_frame_and_continuations(daemon):
    """20,000 + 20,000 block numbers: datagrams of at most MAX_DATAGRAM bytes, sent back to back, that the
    daemon's ``Partial`` assembles into the very frame; one reply answers them."""
    client = AttachClient(daemon.target)
    try:
        frame = FRAME._replace(remote_blocks=tuple(range(7, 20_007)), local_blocks=tuple(range(40_000, 20_000, -1)),
                               src_layers=(0, 1), exclusive=True)
        threads, out = in_threads(1, lambda i: client.transfer(frame, "pull_blocks", 30))
        first = daemon.take(1)[0]
        rid, partial = ff.decode_request(first)
        assert isinstance(partial, ff.Partial) and partial.total == 40_000
        sizes = [len(first)]
        while partial.missing:
            more = daemon.take(1)[0]
            assert ff.is_continuation(more) and ff.request_id_of(more) == rid
            sizes.append(len(more))
            partial.add(more)
        assert partial.frame() == frame and len(sizes) == 5 and max(sizes) <= ff.MAX_DATAGRAM
        daemon.answer(first)
        threads[0].join(10)
        assert out[0] == (4096, "tcp")
    finally:
        client.close()


def test_many_rounds_of_concurrent_calls_never_lose_a_reply(daemon):
    """Leadership passes between callers over and over: every call of every round is answered."""
    client = AttachClient(daemon.target)
    stop = threading.Event()

    def answer_all() -> None:
        while not stop.is_set():
            try:
                request = daemon.requests.get(timeout=0.1)
            except queue.Empty:
                continue
            daemon.answer(request)
    answerer = threading.Thread(target=answer_all, daemon=True)
    answerer.start()
    try:
        threads, out = in_threads(8, lambda i: [client.transfer(FRAME, "pull_blocks", 30) for _ in range(50)])
        for t in threads:
            t.join(60)
        assert out == {i: [(4096, "tcp")] * 50 for i in range(8)}
    finally:
        stop.set()
        answerer.join(5)
        client.close()



def test_a_lone_caller_fails_with_llm_failed_when_the_daemon_hangs_up(daemon, caplog):
    """The one call in flight reads the connection itself (no waiter): the hang-up fails it with LLM_FAILED, is
    logged once, and leaves nobody marked as reading."""
    client = AttachClient(daemon.target)
    try:
        with caplog.at_level(logging.WARNING, logger="llm_datadist._attach"):
            threads, out = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 60))
            daemon.take(1)
            assert client._reading and client._pending == {}    # the lone caller reads; no waiter registered
            daemon.hang_up()
            threads[0].join(30)
            client._watcher.join(10)
        err = out[0]
        assert isinstance(err, LLMException) and err.status_code == LLMStatusCode.LLM_FAILED
        assert "[pull_blocks] failed" in str(err)
        assert caplog.text.count("is gone") == 1 and not client._reading
        with pytest.raises(LLMException) as info:              # and every later call fails at once
            client.transfer(FRAME, "pull_blocks", 30)
        assert info.value.status_code == LLMStatusCode.LLM_FAILED
    finally:
        client.close()


def test_a_lone_caller_hands_a_descriptor_reply_to_the_call_that_came_meanwhile(daemon):
    """A pull reads the connection alone; a pool export comes meanwhile and waits: the lone caller reads the
    export's reply, descriptor and all, and hands it over -- the descriptor works -- then gets its own reply."""
    client = AttachClient(daemon.target)
    pool = os.memfd_create("pool")
    got = -1
    try:
        os.write(pool, b"pool bytes")
        pull, out_pull = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        first = daemon.take(1)[0]
        assert client._reading
        export, out_export = in_threads(1, lambda i: client.export_pool(7, "HOST", "allocate_cache"))
        asked = attach_pb2.AttachRequest.FromString(daemon.take(1)[0])
        assert daemon.conn is not None
        socket.send_fds(daemon.conn, [attach_pb2.AttachReply(request_id=asked.request_id, pool=attach_pb2.PoolExported(
            size=10)).SerializeToString()], [pool])
        export[0].join(10)
        result = out_export[0]
        assert isinstance(result, tuple), result
        got, size = result[0], result[1]
        assert size == 10 and os.pread(got, 10, 0) == b"pool bytes"
        assert pull[0].is_alive()                                # still waiting for its own
        daemon.answer(first, nbytes=77)
        pull[0].join(10)
        assert out_pull[0] == (77, "tcp") and client._pending == {} and not client._reading
    finally:
        os.close(pool)
        if got >= 0:
            os.close(got)
        client.close()


def test_the_lone_caller_and_a_follower_each_get_their_own_refusal(daemon):
    """The lone caller's reply is decoded where it is read, a follower's after the hand-over: the same status codes
    and messages either way."""
    client = AttachClient(daemon.target)
    try:
        lone, out_lone = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        first = daemon.take(1)[0]
        assert client._reading
        follower, out_follower = in_threads(1, lambda i: client.transfer(FRAME, "pull_cache", 30))
        second = daemon.take(1)[0]
        daemon.answer(second, status=int(LLMStatusCode.LLM_LINK_BUSY))
        follower[0].join(10)
        daemon.answer(first, status=int(LLMStatusCode.LLM_NOT_YET_LINK))
        lone[0].join(10)
        for out, func, code in ((out_lone, "pull_blocks", LLMStatusCode.LLM_NOT_YET_LINK),
                                (out_follower, "pull_cache", LLMStatusCode.LLM_LINK_BUSY)):
            err = out[0]
            assert isinstance(err, LLMException) and err.status_code == code
            assert str(err) == f"[{func}] failed, error code is {code}, no."
        assert client._pending == {} and not client._reading
    finally:
        client.close()


def test_closing_the_connection_mid_flight_fails_every_waiter_at_once(daemon, caplog):
    """A lone caller reading, 15 transfers waiting on their mailboxes and a protobuf call among them: ``close``
    fails every one with LLM_FAILED at once (no deadline waited out), logs nothing (we closed it), and leaves
    nobody waiting or reading."""
    client = AttachClient(daemon.target)
    with caplog.at_level(logging.WARNING, logger="llm_datadist._attach"):
        lone, out_lone = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 60))
        daemon.take(1)
        assert client._reading
        threads, out = in_threads(15, lambda i: client.transfer(FRAME._replace(local_cache_id=i), "pull_blocks", 60))
        export, out_export = in_threads(1, lambda i: client.export_pool(7, "HOST", "allocate_cache"))
        daemon.take(16)
        client.close()
        for t in (*lone, *threads, *export):
            t.join(5)                      # far below the calls' 60 s deadline
    assert not any(t.is_alive() for t in (*lone, *threads, *export))
    for err in (out_lone[0], *out.values(), out_export[0]):
        assert isinstance(err, LLMException) and err.status_code == LLMStatusCode.LLM_FAILED, err
    assert len(out) == 15 and "is gone" not in caplog.text
    assert client._pending == {} and not client._reading and not client._watcher.is_alive()


def test_waiting_callers_cost_a_fixed_number_of_python_calls_whatever_their_number(daemon):
    """Python calls per transfer (profile "call" events in every caller's thread, counted in the client's and the
    frame module's code): the lone caller reading for the others makes ``LONE_CALLS`` (transfer, _read, _send,
    encode_frames, _head) with 1 or 7 waiting callers, plus one ``_hand`` and one ``_relay_one`` per batch of
    replies it hands over (at most one per reply; how the replies batch is timing), and a waiting caller
    ``WAITING_CALLS`` (those but _read, and _exchange, _await) and at most one ``_relay_one`` (passing the next
    reply of the batch on). A count, not a timing: the lone caller is answered last, so no waiting caller ever leads."""
    client = AttachClient(daemon.target)
    counted = ("llm_datadist", "fastframe")

    def calls_of(waiting: int) -> tuple[int, list[int], list[str]]:
        per: dict[str, list[str]] = {}

        def hook(frame, event, arg):  # noqa: ANN001, ANN202, ARG001
            if event == "call" and any(part in frame.f_code.co_filename for part in counted):
                per.setdefault(threading.current_thread().name, []).append(frame.f_code.co_name)
        threading.setprofile(hook)
        try:
            lone, out_lone = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
            first = daemon.take(1)[0]
            threads, out = in_threads(waiting, lambda i: client.transfer(FRAME, "pull_blocks", 30))
            for request in reversed(daemon.take(waiting)):
                daemon.answer(request)
            for t in threads:
                t.join(10)
            daemon.answer(first)
            lone[0].join(10)
        finally:
            threading.setprofile(None)
        assert out_lone[0] == (4096, "tcp") and out == {i: (4096, "tcp") for i in range(waiting)}
        names = [t.name for t in threads]
        lone_calls = per[lone[0].name]
        handed = lone_calls.count("_hand")
        assert 1 <= handed <= waiting, lone_calls
        # each batch handed starts a relay: every caller woken puts the next reply in (one call each, or none when
        # the relay is empty)
        relayed = {n: per[n].count("_relay_one") for n in [lone[0].name, *names]}
        assert relayed[lone[0].name] == handed and all(relayed[n] <= 1 for n in names), relayed
        return (len(lone_calls) - 2 * handed, [len(per[n]) - relayed[n] for n in names],
                [c for c in per[names[0]] if c != "_relay_one"])

    try:
        lone_1, waiting_1, names = calls_of(1)
        lone_7, waiting_7, _ = calls_of(7)
        assert lone_1 == lone_7 == LONE_CALLS, (lone_1, lone_7)
        assert set(waiting_7) == set(waiting_1) == {WAITING_CALLS}, (waiting_1, names)
        assert client._pending == {} and not client._reading
    finally:
        client.close()


def test_a_reader_keeps_each_calls_own_deadline_whatever_the_last_call_waited(daemon):
    """The one reader blocks in ``recvmsg`` bounded by SO_RCVTIMEO, set only when a call's time left differs from
    what is set: a call with a shorter timeout than the call before still times out at its own deadline (not the
    earlier call's 30 s: the join would outlast it), and a longer call after it is not cut short by the shorter
    bound -- it is answered after the short one's deadline has passed."""
    client = AttachClient(daemon.target)
    try:
        first, out_first = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        daemon.answer(daemon.take(1)[0])
        first[0].join(10)
        assert out_first[0] == (4096, "tcp")
        short, out_short = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 0.3))
        late = daemon.take(1)[0]
        short[0].join(10)
        err = out_short[0]
        assert isinstance(err, LLMException) and err.status_code == LLMStatusCode.LLM_TIMEOUT, err
        assert str(err) == f"[pull_blocks] failed, error code is {LLMStatusCode.LLM_TIMEOUT}, datadistd did not " \
                           "answer in time."
        daemon.answer(late)                  # late: nobody waits for it any more
        long, out_long = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        request = daemon.take(1)[0]
        long[0].join(0.9)                    # three times the short call's bound: still waiting
        assert long[0].is_alive()
        daemon.answer(request, nbytes=55)
        long[0].join(10)
        assert out_long[0] == (55, "tcp") and client._pending == {} and not client._reading
    finally:
        client.close()


def test_a_caller_past_its_deadline_gets_its_reply_still_waiting_in_the_relay(daemon):
    """Replies a reader hands over wait in ``_relay`` until a woken caller puts them in: a caller whose deadline
    passes while its reply waits there -- taken out of ``_pending``, not yet in its mailbox (here: nobody woken to
    pass it on) -- gets that reply, not LLM_TIMEOUT."""
    client = AttachClient(daemon.target)
    try:
        lone, out_lone = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        first = daemon.take(1)[0]
        follower, out_follower = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 0.5))
        rid = ff.decode_request(daemon.take(1)[0])[0]
        with client._lock:             # what a reader's _hand does to a reply it read, short of passing it on
            box = client._pending.pop(rid)
            client._relay.append((box, ff.encode_reply(rid, 0, 99, "tcp")))
        follower[0].join(10)
        assert out_follower[0] == (99, "tcp")
        daemon.answer(first)
        lone[0].join(10)
        assert out_lone[0] == (4096, "tcp") and client._pending == {} and not client._relay
    finally:
        client.close()


BIG = FRAME._replace(remote_blocks=tuple(range(10_000)), local_blocks=tuple(range(10_000)))   # 3 datagrams


def test_a_request_of_several_datagrams_waits_for_a_lone_one_under_way(daemon):
    """A lone datagram is sent without a lock: a request of several datagrams waits until the lone ones already
    being sent are out (here one, marked as under way by hand) before its first, so nothing comes between its
    frames; then they go back to back."""
    client = AttachClient(daemon.target)
    try:
        client._sending.append(1)             # a lone datagram being sent, as _send marks it
        threads, out = in_threads(1, lambda i: client.transfer(BIG, "pull_blocks", 30))
        with pytest.raises(queue.Empty):
            daemon.requests.get(timeout=0.5)    # held back: nothing sent yet
        client._sending.pop()
        first = daemon.take(1)[0]
        rid, partial = ff.decode_request(first)
        assert isinstance(partial, ff.Partial)
        while partial.missing:
            partial.add(daemon.take(1)[0])
        assert partial.frame() == BIG
        daemon.answer(first)
        threads[0].join(10)
        assert out[0] == (4096, "tcp") and not client._multi
    finally:
        client.close()


def test_a_lone_datagram_goes_behind_a_request_of_several_being_sent(daemon):
    """While a request of several datagrams is being sent (``_multi``, under the send lock: held here by hand) a
    lone datagram is not sent between its frames: it waits for the lock."""
    client = AttachClient(daemon.target)
    try:
        with client._send_lock:
            client._multi = True
            threads, out = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
            with pytest.raises(queue.Empty):
                daemon.requests.get(timeout=0.5)
            client._multi = False
        daemon.answer(daemon.take(1)[0])
        threads[0].join(10)
        assert out[0] == (4096, "tcp") and client._sending == []
    finally:
        client.close()


def test_requests_of_several_datagrams_among_many_lone_ones_arrive_whole(daemon):
    """Callers in many threads, lone datagrams and requests of several at once: every request's frames reach the
    daemon back to back (each first frame's continuations right after it) and every caller gets its reply."""
    client = AttachClient(daemon.target)
    try:
        frames = [BIG._replace(local_cache_id=i) if i % 8 == 0 else FRAME._replace(local_cache_id=i)
                  for i in range(48)]
        threads, out = in_threads(48, lambda i: client.transfer(frames[i], "pull_blocks", 30))
        seen = 0
        while seen < 48:
            data = daemon.take(1)[0]
            rid, got = ff.decode_request(data)         # never a continuation out of its place: FrameError
            if isinstance(got, ff.Partial):
                while got.missing:
                    got.add(daemon.take(1)[0])
                got = got.frame()
            assert got == frames[got.local_cache_id]
            daemon.answer(data, nbytes=got.local_cache_id)
            seen += 1
        for t in threads:
            t.join(10)
        assert out == {i: (i, "tcp") for i in range(48)}
        assert client._pending == {} and client._sending == [] and not client._relay
    finally:
        client.close()


def test_a_waiting_caller_that_takes_over_reading_keeps_its_own_deadline(daemon):
    """A lone caller (30 s) reads; a caller with 0.5 s waits on its mailbox; the lone caller's reply comes, it
    leaves and the waiting caller takes over reading -- blocking in ``recvmsg`` under its own bound, not the lone
    caller's 30 s: it times out with LLM_TIMEOUT (the join would outlast the wrong bound), withdrawn, nobody
    reading after it; its late reply is dropped."""
    client = AttachClient(daemon.target)
    try:
        lone, out_lone = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        first = daemon.take(1)[0]
        waiting, out_waiting = in_threads(1, lambda i: client.transfer(FRAME, "pull_cache", 0.5))
        second = daemon.take(1)[0]
        daemon.answer(first)
        lone[0].join(10)
        assert out_lone[0] == (4096, "tcp")
        waiting[0].join(10)
        err = out_waiting[0]
        assert isinstance(err, LLMException) and err.status_code == LLMStatusCode.LLM_TIMEOUT, err
        assert client._pending == {} and not client._reading
        daemon.answer(second)                     # late: read by the next reader, dropped
        again, out_again = in_threads(1, lambda i: client.transfer(FRAME, "pull_blocks", 30))
        daemon.answer(daemon.take(1)[0], nbytes=3)
        again[0].join(10)
        assert out_again[0] == (3, "tcp")
    finally:
        client.close()
