"""Private: the worker's attach connection to its daemon (see ``datadist/v1/attach.proto``).

One ``SOCK_SEQPACKET`` connection per ``LLMDataDist``: the daemon learns who we are from the
kernel, answers the capability every DataDist call carries, takes memory we register as file
descriptors and hands us the descriptors of our engine's pools, and runs our pulls and pushes without
a gRPC call, as binary frames (``datadist.fastframe``; block lists past one datagram in continuation
frames, protocol 4). Closing it (or exiting) ends our lease: the daemon then releases our engines.

Requests may be in flight from many threads at once, each with a request id and a mailbox (a C
``queue.SimpleQueue``). Nobody reads for them in the background: a caller waiting for its reply reads the
socket itself while no other caller does (the *leader*), one blocking ``recvmsg`` per wait bounded by SO_RCVTIMEO
(``_read``); it reads every reply that is in, then hands them over as a relay -- the first in its caller's mailbox,
each caller woken putting the next in (``_hand``): one woken caller runs at a time -- and, when it leaves, the
leadership passes to a caller still waiting (a ``_LEAD`` token in its mailbox). A request of one datagram is
sent without a lock; one of several datagrams goes back to back under a lock (``_send``). A thread of ours only
watches the connection for the daemon hanging up (``_watch``: no wake-up per reply), so a daemon that stops -- or
our own ``close`` -- fails every waiting call at once with LLM_FAILED (the daemon's stopping is logged); every
wait has its deadline (LLM_TIMEOUT). A transfer that finds nobody reading (the usual case: one caller) leads at
once with no mailbox: it sends, reads until its own reply (handing others theirs) and leaves (``transfer``): two
syscalls, no exception.
"""

from __future__ import annotations

import array
import collections
import errno
import itertools
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
from typing import Deque, Dict, List, Optional, Sequence, Set, Tuple, Union

from datadist import fastframe, sockdir
from datadist.address import socket_path
from datadist.status import LLMStatusCode, code_2_status
from datadist.v1 import attach_pb2

from .status import LLMException

__all__ = ["AttachClient", "attach_path", "unix_path", "CAPABILITY_METADATA_KEY"]

log = logging.getLogger(__name__)

CAPABILITY_METADATA_KEY = "datadist-capability"
PROTOCOL_VERSION = 4
_TIMEOUT_S = 30.0
_MAGIC = bytes([fastframe.MAGIC])
_DONTWAIT = int(socket.MSG_DONTWAIT)
_FD_SPACE = socket.CMSG_SPACE(4)     # a reply carries at most one descriptor
_REPLY = fastframe.REPLY
_RID = struct.Struct("<8xQ")         # a frame's request id


def _fds_of(anc: List[Tuple[int, int, bytes]]) -> List[int]:
    """The descriptors of a datagram's ancillary data (``socket.recv_fds``, which in Python < 3.12 drops the
    flags it is given: we read with MSG_DONTWAIT on a blocking socket)."""
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def unix_path(target: str) -> str:
    """The socket path of a daemon address: a plain path or a ``unix:`` target (``datadist.address``, the parser
    ``datadistctl`` uses too)."""
    try:
        return socket_path(target)
    except ValueError as exc:
        raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, {exc}.",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID) from None


def attach_path(target: str) -> str:
    return unix_path(target) + ".attach"


_UCRED = struct.Struct("iII")   # struct ucred: pid_t pid, uid_t uid, gid_t gid (SO_PEERCRED; ids unsigned)


def _check_daemon_uid(path: str, uid: int) -> None:
    """Refuse (LLM_FAILED) a daemon socket unless the directory it is in is one only the uid serving it (the kernel's
    word) and root could have made (``datadist.sockdir``): the daemon's own rule for a daemon of our uid or root's,
    and for any other uid no directory of its own where every user may create names (``/tmp``). Another user who
    created ``/tmp/datadist-<our uid>/`` first gets neither our memory nor our calls."""
    me = os.geteuid()
    directory = os.path.dirname(os.path.abspath(path))
    try:
        why = sockdir.culprit(directory, uid, given=uid not in (me, 0))
    except OSError as exc:
        why = f"{exc.filename or directory} cannot be looked at ({exc.strerror or exc})"
    if why is None:
        return
    code = LLMStatusCode.LLM_FAILED
    raise LLMException(
        f"[init] failed, error code is {code}, refusing the daemon socket {path}: it is served by uid {uid} (this "
        f"process is uid {me}) and its directory is not one only that uid and root could have made ({why}); another "
        "user may have made it to receive this worker's memory and calls, so nothing was sent. Fix: remove the "
        "directory (as root or its owner) and start the daemon again, or run a shared daemon with a socket directory "
        "root made for it (systemd's RuntimeDirectory=, /run/datadist) and point DATADIST_DAEMON at it",
        status_code=code)


#: what a caller's mailbox gets: its reply (a binary transfer reply as read, or ``(reply, fd)``: a protobuf
#: AttachReply or a binary reply with the descriptor it carried, -1 for none), why the connection failed (str), or
#: ``_LEAD``: nobody reads the connection now, the caller should
_Item = Union[bytes, Tuple[Union[bytes, attach_pb2.AttachReply], int], str, None]
_LEAD = None
_Raw = Union[bytes, attach_pb2.AttachReply]
_Reply = Tuple[attach_pb2.AttachReply, int]
_HANDING_S = 1.0        # a reply being handed over as its caller gives up is in its mailbox within this
_SLACK_S = 1e-3         # a reader's SO_RCVTIMEO may differ from its time left by this (one timeout: set once)
_TIMEVAL = struct.Struct("ll")
_YIELD_S = 1e-4         # a sender of several datagrams waits this between looks at the lone ones under way


class AttachClient:
    def __init__(self, target: str, timeout: float = _TIMEOUT_S) -> None:
        self.path = attach_path(target)
        self.timeout = timeout
        # a request of one datagram is sent without a lock (the usual pull: no lock contended by the callers
        # sending at once, each a futex call and a thread switch); one of several datagrams -- which go back to back
        # -- under _send_lock, once the lone datagrams being sent (``_sending``: one entry each) are out (``_send``)
        self._send_lock = threading.Lock()
        self._sending: List[int] = []
        self._multi = False
        # reading and handing over what was read are one step: a reply read before the daemon's hang-up reaches
        # its caller before the hang-up fails the rest (the watcher and a leader may both be reading)
        self._recv_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # request id -> the waiting caller's mailbox (a C queue: put and get, no Python call and no over-release);
        # added under _lock, taken out by whoever hands the reply over (dict.pop is atomic: exactly one does)
        self._pending: Dict[int, queue.SimpleQueue[_Item]] = {}
        self._polled: Set[int] = set()     # requests sent by ``submit``: their owners poll, nobody waits on them
        self._reading = False              # a caller (the leader) reads the socket
        # replies read, taken out of _pending, not yet in their mailboxes: each caller woken puts the next (``_hand``)
        self._relay: Deque[Tuple[queue.SimpleQueue[_Item], bytes]] = collections.deque()
        self._broken: Optional[str] = None
        self._closing = False
        self._rcvtimeo = 0.0               # the socket's SO_RCVTIMEO (0: none), set by the one reader (``_read``)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
            # the kernel's word on who serves the socket, checked before a byte -- let alone memory -- is sent
            self.daemon_pid, daemon_uid, _ = _UCRED.unpack(
                self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            _check_daemon_uid(self.path, daemon_uid)
            self._sock.settimeout(None)         # the reader blocks in recvmsg bounded by SO_RCVTIMEO (``_read``);
            # a send the daemon does not take within `timeout` fails (SO_SNDTIMEO) instead of hanging
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                  struct.pack("ll", int(timeout), int(timeout % 1 * 1e6)))
            self._watcher = threading.Thread(target=self._watch, name="datadist-attach", daemon=True)
            self._watcher.start()
            welcome = self._call(attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
                protocol_version=PROTOCOL_VERSION)), "init")[0].welcome
        except OSError as exc:
            self.close()
            raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_FAILED}, cannot attach to datadistd "
                               f"at {self.path}: {exc.strerror or exc}; is it running, and is this user in its group?",
                               status_code=LLMStatusCode.LLM_FAILED) from None
        except BaseException:
            self.close()
            raise
        if welcome.protocol_version < PROTOCOL_VERSION:
            self.close()
            raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_FAILED}, datadistd at {self.path} "
                               f"speaks attach protocol {welcome.protocol_version}, this client "
                               f"{PROTOCOL_VERSION}: update datadistd", status_code=LLMStatusCode.LLM_FAILED)
        self.capability = bytes(welcome.capability)
        self.uid, self.pid = welcome.uid, welcome.pid
        self.protocol = welcome.protocol_version
        self.memory_backend = welcome.memory_backend or "host"
        self.device_id = int(welcome.device_id)
        # self.daemon_pid (read at connect): the daemon's pid as the kernel reports it for this connection (never
        # what a message says), the one process this worker's exported device memory may be imported by;
        # ... as the NPU driver knows it, for the allow list of NPU memory this worker hands over (the daemon's
        # word where PID namespaces differ; the kernel's where the daemon sends none)
        self.daemon_tgid = int(welcome.bare_tgid) or self.daemon_pid

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return ((CAPABILITY_METADATA_KEY, self.capability.hex()),)

    # ---- reading: whoever waits reads ---------------------------------------------------------

    def _hand_on(self) -> None:
        """Under ``_lock``, when the leader left or a caller gave up: a caller still waiting takes over reading (not
        a submitted request's mailbox: nobody waits on it, its owner polls -- ``poll``)."""
        if not self._reading and self._pending:
            for rid, box in self._pending.items():
                if rid not in self._polled:
                    box.put(_LEAD)
                    return

    def _deliver(self, data: bytes, anc: List[Tuple[int, int, bytes]]) -> None:
        """One reply read (under ``_recv_lock``) that is not a plain transfer reply -- a protobuf reply, a reply with
        descriptors, a malformed frame -- to the caller waiting for its request id; dropped, descriptors closed,
        when nobody waits for it any more (it timed out)."""
        fds = _fds_of(anc) if anc else []
        reply: _Raw
        if data[:1] == _MAGIC:
            reply, rid = data, fastframe.request_id_of(data)
        else:
            reply = attach_pb2.AttachReply()
            try:
                reply.ParseFromString(data)
            except Exception:  # noqa: BLE001 - a reply we cannot read answers nobody
                rid = None
            else:
                rid = reply.request_id
        box = self._pending.pop(rid, None) if rid is not None else None
        if box is None:
            for fd in fds:
                os.close(fd)
            return
        for fd in fds[1:]:
            os.close(fd)
        box.put((reply, fds[0] if fds else -1))

    def _hand(self, replies: List[bytes]) -> None:
        """Hand the plain transfer replies read (under ``_recv_lock``) to their callers -- a late one, nobody waits
        for any more, is dropped -- and empty ``replies``: the first goes in its caller's mailbox, the rest wait in
        ``_relay`` and every caller woken puts the next one in (``_relay_one``) as it wakes. One woken caller runs
        at a time instead of all of them fighting for the GIL (a thread switch and a futex call each)."""
        pop, relay = self._pending.pop, self._relay
        for data in replies:
            box = pop(_RID.unpack_from(data)[0], None)
            if box is not None:
                relay.append((box, data))
        replies.clear()
        self._relay_one()

    def _relay_one(self) -> None:
        """The next reply waiting in ``_relay`` into its caller's mailbox (by whoever was woken last)."""
        try:
            box, data = self._relay.popleft()
        except IndexError:
            return
        box.put(data)

    def _drain(self) -> bool:
        """The watcher's read at a hang-up: every reply that is in, until the socket has none (no bound: the daemon
        answers only what we asked), then handed over (``_hand``): every read before any caller wakes (a woken
        caller takes the GIL from the reads otherwise); False once the connection is gone (every waiting call
        failed, after the replies read before)."""
        recvmsg, got = self._sock.recvmsg, []
        with self._recv_lock:
            while True:
                try:
                    data, anc, _, _ = recvmsg(fastframe.MAX_DATAGRAM, _FD_SPACE, _DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    why = None
                except OSError as exc:
                    why = f"the attach connection to datadistd failed: {exc.strerror or exc}"
                else:
                    if data and not anc and data[0] == fastframe.MAGIC and len(data) >= _REPLY.size:
                        got.append(data)
                        continue
                    if data:
                        self._deliver(data, anc)
                        continue
                    why = "datadistd closed the attach connection"
                if got:
                    self._hand(got)
                if why is None:
                    return True
                self._lost(why)
                return False

    def _read(self, rid: int, box: Optional[queue.SimpleQueue[_Item]], func: str, deadline: float,
              data: Sequence[bytes] = ()) -> _Item:
        """As the one reader (``_reading`` is ours): send ``data`` (the lone caller's request: under the read lock,
        so that the watcher cannot take its reply at a hang-up), then read until request ``rid``'s reply -- a plain
        transfer reply is returned as read (taken out of ``_pending`` when ``box`` is ours there), anything else
        for ``rid`` reaches ``box`` and is returned from it -- or ``deadline`` (None: the request withdrawn;
        LLM_TIMEOUT when ``box`` is None, the lone caller's). LLMException (LLM_FAILED) when the connection fails,
        every waiting call failed with it.

        One blocking ``recvmsg`` per wait, bounded by SO_RCVTIMEO (set only when the time left differs from what is
        set: a run of calls with one timeout sets it once): a lone pull is two syscalls and no exception, and a
        hang-up (or our ``close``) ends the read at once. (A signal whose handler runs meanwhile restarts the wait
        with the bound set, PEP 475: the deadline is checked again only when the read returns.) Replies for other
        calls are read on without blocking and handed over once the socket has no more (a woken caller takes the
        GIL from the reads otherwise), and before a hang-up fails the rest."""
        sock = self._sock
        recvmsg = sock.recvmsg
        others: List[bytes] = []
        with self._recv_lock:
            if data:
                try:
                    self._send(data)
                except OSError as exc:
                    raise self._failed(func, str(exc)) from None
            try:
                while True:
                    try:
                        if others:
                            got, anc, _, _ = recvmsg(fastframe.MAX_DATAGRAM, _FD_SPACE, _DONTWAIT)
                        else:
                            if box is not None and not box.empty():
                                item = box.get_nowait()
                                if item is not _LEAD:      # (a stale call to lead, from before we did)
                                    return item
                                continue
                            left = deadline - time.monotonic()
                            if left <= 0:
                                if box is None:
                                    raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_TIMEOUT}, "
                                                       "datadistd did not answer in time.",
                                                       status_code=LLMStatusCode.LLM_TIMEOUT)
                                with self._lock:
                                    if self._pending.pop(rid, None) is not None:
                                        return None
                                return self._handed(box)
                            if not -_SLACK_S <= self._rcvtimeo - left <= _SLACK_S:
                                usec = int(left * 1e6) + 1      # never 0 (no bound), never short of the deadline
                                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                                _TIMEVAL.pack(usec // 1000000, usec % 1000000))
                                self._rcvtimeo = left
                            got, anc, _, _ = recvmsg(fastframe.MAX_DATAGRAM, _FD_SPACE)
                    except (BlockingIOError, InterruptedError):     # none in yet (DONTWAIT), or SO_RCVTIMEO ran out
                        if others:
                            self._hand(others)
                        continue
                    except OSError as exc:
                        why = f"the attach connection to datadistd failed: {exc.strerror or exc}"
                        self._hand(others)
                        self._lost(why)
                        raise self._failed(func, why) from None
                    if not got:
                        self._hand(others)
                        self._lost("datadistd closed the attach connection")
                        raise self._failed(func, "datadistd closed the attach connection")
                    if got[0] == fastframe.MAGIC:
                        if len(got) >= _REPLY.size:
                            if _RID.unpack_from(got)[0] == rid:
                                if box is not None:
                                    self._pending.pop(rid, None)
                                if anc:
                                    for fd in _fds_of(anc):     # a transfer reply carries none: never leak one
                                        os.close(fd)
                                return got
                            if not anc:
                                others.append(got)
                                continue
                        elif box is None and fastframe.request_id_of(got) == rid:
                            raise self._failed(func, "datadistd answered a transfer frame with something else")
                    self._deliver(got, anc)     # anything else: to its caller (or late: dropped)
            finally:
                if others:
                    self._hand(others)

    def _lead(self, rid: int, box: queue.SimpleQueue[_Item], func: str, deadline: float) -> _Item:
        """``_read`` as the leader (``_reading`` set by the caller), then let a waiting caller lead. Replies read
        by the leaders before are all put in first: ours may be among them (nobody adds to ``_relay`` while we
        read)."""
        try:
            while self._relay:
                self._relay_one()
            return self._read(rid, box, func, deadline)
        finally:
            with self._lock:
                self._reading = False
                self._hand_on()

    def _await(self, rid: int, box: queue.SimpleQueue[_Item], func: str, deadline: float, lead: bool) -> _Item:
        """Request ``rid``'s reply or failure (see ``_Item``), or None at ``deadline`` (the request withdrawn):
        leading the reads when ``lead`` or when called to, else asleep on ``box`` until a leader fills it."""
        get = box.get
        while True:
            if lead:
                return self._lead(rid, box, func, deadline)
            left = deadline - time.monotonic()
            try:
                item = get(True, left) if left > 0 else get(False)
            except queue.Empty:
                with self._lock:
                    if self._pending.pop(rid, None) is not None:
                        self._hand_on()
                        return None
                return self._handed(box)
            if self._relay:
                self._relay_one()
            if item is not _LEAD:
                return item
            with self._lock:
                lead = not self._reading and self._broken is None
                if lead:
                    self._reading = True

    def _handed(self, box: queue.SimpleQueue[_Item]) -> _Item:
        """The reply (or failure) of a caller past its deadline whose request a reader took out just before: it is
        in ``_relay`` (put in first, with every other there) or being put in ``box``; None if it does not come
        within ``_HANDING_S``."""
        while self._relay:
            self._relay_one()
        try:
            item = box.get(True, _HANDING_S)
            while item is _LEAD:
                item = box.get(True, _HANDING_S)
        except queue.Empty:
            return None
        return item

    def _lost(self, why: str) -> None:
        """The connection is gone (under ``_recv_lock``): every waiting call fails; the daemon's ending our lease is
        logged, once."""
        with self._lock:
            first, closing = self._broken is None, self._closing
            if first:
                self._broken = why
            pending, self._pending = self._pending, {}
            for box in pending.values():
                box.put(why)
        if first and not closing:   # the daemon ended our lease (it stopped, or died: the same hang-up)
            log.warning("datadistd at %s is gone (it stopped or died): this engine and its caches are released "
                        "(%s); finalize and init again once it is back", self.path, why)

    def _watch(self) -> None:
        """The watcher thread: asleep until the daemon hangs up (POLLRDHUP / POLLHUP; replies do not wake it), then
        reads what is left to its callers and fails the rest, whether or not anybody is calling."""
        hangup = select.poll()
        hangup.register(self._sock.fileno(), select.POLLRDHUP)
        try:
            while not hangup.poll():
                pass
        except OSError:
            pass
        while self._drain():     # at a hang-up the socket reads to its end, never "nothing yet"
            time.sleep(0.01)

    # ---- calls ---------------------------------------------------------------------------------

    def _send(self, data: Sequence[bytes], fds: Sequence[int] = ()) -> None:
        """Send the datagrams ``data`` of one request, back to back (``fds`` ride with the first); OSError when the
        daemon does not take them (SO_SNDTIMEO). A lone datagram goes without a lock unless datagrams of one
        request are being sent (``_multi``): those take ``_send_lock`` and wait for the lone ones already under
        way (each bounded by SO_SNDTIMEO), so that nothing comes between them. The GIL orders it: a lone sender
        is in ``_sending`` before it reads ``_multi``, a sender of several sets ``_multi`` before it reads
        ``_sending``."""
        sock = self._sock
        if len(data) == 1 and not fds:
            self._sending.append(1)
            try:
                if not self._multi:
                    sock.send(data[0])
                    return
            finally:
                self._sending.pop()
        with self._send_lock:
            if len(data) == 1:
                if fds:
                    socket.send_fds(sock, [data[0]], list(fds))
                else:
                    sock.send(data[0])
                return
            self._multi = True
            try:
                end = time.monotonic() + self.timeout
                while self._sending:
                    if time.monotonic() > end:
                        raise OSError(errno.EBUSY, "lone requests kept the attach connection busy")
                    time.sleep(_YIELD_S)
                if fds:
                    socket.send_fds(sock, [data[0]], list(fds))
                else:
                    sock.send(data[0])
                for more in data[1:]:
                    sock.send(more)
            finally:
                self._multi = False

    def _exchange(self, rid: int, data: Sequence[bytes], func: str, fds: Sequence[int], timeout: Optional[float]
                  ) -> _Item:
        """Send the datagrams ``data`` of request ``rid``, back to back (``fds`` ride with the first), and wait for
        its reply (bytes, or ``(reply, fd)``); LLMException when none comes."""
        box: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        with self._lock:
            if self._broken is not None:
                raise self._failed(func, self._broken)
            self._pending[rid] = box
            lead = not self._reading
            if lead:
                self._reading = True
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            self._send(data, fds)
        except OSError as exc:
            with self._lock:
                self._pending.pop(rid, None)
                if lead:
                    self._reading = False
                self._hand_on()
            raise self._failed(func, str(exc)) from None
        item = self._await(rid, box, func, deadline, lead)
        if item is None:
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_TIMEOUT}, datadistd did not "
                               "answer in time.", status_code=LLMStatusCode.LLM_TIMEOUT)
        if type(item) is str:
            raise self._failed(func, item)
        return item

    def _call(self, request: attach_pb2.AttachRequest, func: str, fds: Sequence[int] = (),
              timeout: Optional[float] = None) -> _Reply:
        """One protobuf request, its reply (and the descriptor it carried, or -1); LLMException on failure."""
        request.request_id = rid = next(self._ids)
        item = self._exchange(rid, (request.SerializeToString(),), func, fds, timeout)
        reply, fd = item if type(item) is tuple else (item, -1)
        if not isinstance(reply, attach_pb2.AttachReply):
            if fd >= 0:
                os.close(fd)
            raise self._failed(func, "datadistd answered a binary frame to a protobuf request")
        if reply.status:
            if fd >= 0:
                os.close(fd)
            code = code_2_status(reply.status)
            raise LLMException(f"[{func}] failed, error code is {code}, {reply.message}.", status_code=code)
        return reply, fd

    @staticmethod
    def _failed(func: str, why: str) -> LLMException:
        return LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, {why}",
                            status_code=LLMStatusCode.LLM_FAILED)

    def submit(self, frame: fastframe.TransferFrame, func: str) -> Tuple[int, "queue.SimpleQueue[_Item]"]:
        """Send a transfer frame without waiting for its reply (HIXL's TransferAsync): ``(request id, mailbox)``
        for ``poll``. Its reply is read by whoever reads the connection next -- a caller waiting on a call of its
        own, or ``poll`` -- and put in the mailbox; a hang-up puts the failure there. LLMException when the frame
        cannot be sent."""
        rid = next(self._ids)
        data = fastframe.encode_frames(rid, frame)
        box: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        with self._lock:
            if self._broken is not None:
                raise self._failed(func, self._broken)
            self._pending[rid] = box
            self._polled.add(rid)
        try:
            self._send(data)
        except OSError as exc:
            self.withdraw(rid)
            raise self._failed(func, str(exc)) from None
        return rid, box

    def poll(self, rid: int, box: "queue.SimpleQueue[_Item]", func: str) -> Optional[Tuple[int, str]]:
        """A submitted transfer's ``(bytes, transport)`` once its reply is in, None until then (reading what the
        connection holds, without blocking, when nobody else reads it); LLMException when it failed."""
        if box.empty():
            self._pump()
        try:
            item = box.get_nowait()
        except queue.Empty:
            return None
        with self._lock:
            self._polled.discard(rid)
        if type(item) is tuple:   # a transfer reply carries no descriptor: never leak one
            item, fd = item
            if fd >= 0:
                os.close(fd)
        if type(item) is str:
            raise self._failed(func, item)
        return self._transfer_result(item, func)

    def withdraw(self, rid: int) -> None:
        """Forget submitted request ``rid`` (its deadline passed, or its owner let it go): a late reply is dropped."""
        with self._lock:
            self._pending.pop(rid, None)
            self._polled.discard(rid)

    def _pump(self) -> None:
        """Read what the connection holds, without blocking, into the mailboxes -- unless a caller reads it already
        (it hands replies over as it reads them)."""
        with self._lock:
            if self._reading or self._broken is not None:
                return
            self._reading = True
        try:
            while self._relay:
                self._relay_one()
            self._drain()
            while self._relay:
                self._relay_one()
        finally:
            with self._lock:
                self._reading = False
                self._hand_on()

    def _transfer_result(self, got: object, func: str) -> Tuple[int, str]:
        """A transfer reply frame's ``(bytes, transport)``; LLMException with its status when it failed."""
        if type(got) is not bytes or len(got) < _REPLY.size:
            raise self._failed(func, "datadistd answered a transfer frame with something else")
        _, _, status, nbytes, transport = _REPLY.unpack_from(got)
        if status:
            code = code_2_status(status)
            raise LLMException(f"[{func}] failed, error code is {code}, "
                               f"{got[_REPLY.size:].decode(errors='replace')}.", status_code=code)
        return nbytes, transport.rstrip(b"\0").decode(errors="replace")

    def transfer(self, frame: fastframe.TransferFrame, func: str, timeout: float) -> Tuple[int, str]:
        """A pull or push over this connection: ``(bytes, transport)``. Binary frames: one each way, or a first
        frame and continuation frames when the block lists do not fit one datagram (``fastframe.encode_frames``).

        When nobody reads the connection (no other call in flight, or none reading), this caller becomes the
        reader at once: it sends and reads until its own reply, with no mailbox -- replies for calls that came
        meanwhile go to them, and when it leaves a caller still waiting takes over. It holds the read lock from
        before it sends, so the watcher cannot take its reply at a hang-up. Otherwise it waits on its mailbox, or
        leads when called to (``_exchange``)."""
        rid = next(self._ids)
        data = fastframe.encode_frames(rid, frame)
        with self._lock:
            solo = not self._reading and self._broken is None
            if solo:
                self._reading = True
        if solo:
            try:
                got = self._read(rid, None, func, time.monotonic() + timeout, data)
            finally:
                with self._lock:
                    self._reading = False
                    if self._pending:
                        self._hand_on()
        else:
            got = self._exchange(rid, data, func, (), timeout)
            if type(got) is tuple:             # a transfer reply carries no descriptor: never leak one
                raw, fd = got
                if fd >= 0:
                    os.close(fd)
                got = raw
        if type(got) is bytes and len(got) >= _REPLY.size:   # success answered here: no call on the hot path
            _, _, status, nbytes, transport = _REPLY.unpack_from(got)
            if not status:
                return nbytes, transport.rstrip(b"\0").decode(errors="replace")
        return self._transfer_result(got, func)

    def import_memory(self, fds: Sequence[int], pieces: Sequence[Tuple[int, int]], offset: int, length: int,
                      func: str) -> int:
        """Hand ``pieces`` (``(file_offset, length)`` of each descriptor) over; returns the memory id."""
        msg = attach_pb2.ImportMemory(pieces=[attach_pb2.FdPiece(file_offset=o, length=n) for o, n in pieces],
                                      offset=offset, length=length)
        return self._call(attach_pb2.AttachRequest(import_memory=msg), func, fds)[0].imported.memory_id

    def import_device_memory(self, key: str, device: int, length: int, func: str) -> int:
        """Hand over ``length`` bytes of NPU memory by the IPC ``key`` exported for the daemon; the memory id."""
        msg = attach_pb2.ImportMemory(device_key=key, device_id=device, length=length)
        return self._call(attach_pb2.AttachRequest(import_memory=msg), func)[0].imported.memory_id

    def release_memory(self, memory_ids: List[int]) -> None:
        """Give back imported memory the daemon did not put into a cache (best effort)."""
        for memory_id in memory_ids:
            try:
                self._call(attach_pb2.AttachRequest(release_memory=attach_pb2.ReleaseMemory(memory_id=memory_id)),
                           "release")
            except LLMException:
                return

    def _bare_tgid(self) -> int:
        """This process's pid as the NPU driver sees it (0 when the daemon's memory is not NPU memory)."""
        if self.memory_backend != "acl":
            return 0
        from datadist_ascend.acl import acl

        return acl().bare_tgid()

    def export_pool(self, engine_id: int, pool: str, func: str) -> Tuple[int, int, str, int]:
        """``(fd, size, device_key, device_id)`` of one of our engine's pools: a descriptor (the caller closes it),
        or for an NPU pool ``fd == -1`` and the IPC key only this process may import."""
        reply, fd = self._call(attach_pb2.AttachRequest(export_pool=attach_pb2.ExportPool(
            engine_id=engine_id, pool=pool, bare_tgid=self._bare_tgid())), func)
        if reply.pool.device_key:
            if fd >= 0:
                os.close(fd)
            return -1, int(reply.pool.size), reply.pool.device_key, int(reply.pool.device_id)
        if fd < 0:
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, datadistd sent no "
                               "descriptor for the pool", status_code=LLMStatusCode.LLM_FAILED)
        return fd, int(reply.pool.size), "", 0

    def close(self) -> None:
        with self._lock:
            self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)   # wakes the watcher, which fails whatever still waits
        except OSError:
            pass
        watcher = getattr(self, "_watcher", None)     # none when the connection was never made
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(5.0)
        self._sock.close()
