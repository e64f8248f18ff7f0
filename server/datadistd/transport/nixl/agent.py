"""A NIXL agent: its memory registrations, and WRITEs and READs with a deadline.

NIXL (NVIDIA's inference transfer library, the ``nixl-cu12`` wheel) is loaded lazily (``ucx.load_api``), by the
first ``Agent``; without it the transport refuses with ``LLM_FEATURE_NOT_ENABLED`` naming the package.
Only host memory that is mapped into the daemon is registered (``DRAM``): NIXL moves bytes between
registered ranges of two agents, and a handle without a mapping has no address to give it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...memory.base import MemoryHandle, Segment
from ..onesided.agent import InFlight
from ..onesided.rows import tensor_ranges
from ..onesided.wire import PROBE
from ..registrations import Registration, RegistrationTable
from .ucx import fence_seconds, load_api, status_of

__all__ = ["Agent"]

log = logging.getLogger("datadistd.transport.nixl")

_SPIN = 200          # status checks before the first sleep (a small WRITE completes in a few)
_NAP_MAX = 0.0005    # the longest sleep between status checks
_LOCAL_ROWS_MAX = 1 << 16   # rows of a destination registration prepared once (a larger one: prepared per READ)
_LOCAL_LISTS_MAX = 4        # row geometries (row size, phase) prepared per destination registration


class Agent:
    """One NIXL agent with one backend, and the registrations of the handles it moved.

    Registrations are made on first use of a handle and live until the handle is collected or found
    closed; ``addresses`` gives a transfer's extents ``(address, length)`` and the registrations they use."""

    def __init__(self, name: str, backend: str = "UCX") -> None:
        api = load_api()
        try:
            # NIXL's own progress thread polls with no pause: a core per agent, idle or not (measured: 2.0 s
            # of CPU in 2 s). Off; progress is made by our calls -- status checks of a WRITE, notification
            # reads by the transport's progress thread (``NixlTransport._progress``), which naps when idle
            config = api.nixl_agent_config(enable_prog_thread=False, backends=[backend],
                                           sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW)
            self._agent = api.nixl_agent(name, config)
        except Exception as exc:  # noqa: BLE001 - NIXL raises RuntimeError and its own classes
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                f"NIXL agent could not start ({type(exc).__name__}: {exc})") from None
        if backend not in self._agent.backends:
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                f"NIXL backend {backend!r} is not available here; plugins found: "
                                f"{', '.join(self._agent.get_plugin_list()) or 'none'}")
        self.name = name
        self.backend = backend
        self.fence = fence_seconds()   # after load_api: its default counts
        self._bindings = importlib.import_module(api.__name__.rsplit(".", 1)[0] + "._bindings")
        self._regs = RegistrationTable(self._register, self._deregister)
        self._published: dict[int, Any] = {}   # the registrations of published caches, by id (``publish``)
        # the raw request calls of the READ path (``read_rows``): C calls, no Python frame per status check
        self._raw = self._agent.agent
        self._raw_backends = [self._agent.backends[backend]]
        self._read_op = self._agent.nixl_ops["READ"]
        self._done, self._in_prog = self._bindings.NIXL_SUCCESS, self._bindings.NIXL_IN_PROG
        # destination rows prepared once per registration: serial -> (row size, phase) -> prepared list (None: too
        # many rows, prepared per READ); dropped, and released, when the registration goes (``_deregister``)
        self._local: dict[int, dict[tuple[int, int], Any]] = {}
        self._local_lock = threading.Lock()
        self._closed = False

    # -- metadata --

    def metadata(self) -> bytes:
        """What a peer needs to reach this agent: its connection info only, no registration. A registration
        reaches a peer only as the partial metadata of what it may touch: a published cache (``publish``), a
        push's destination (``partial_metadata``) -- never a pool or a cache that was not published to it."""
        empty = self._bindings.nixlRegDList(self._agent.nixl_mems["DRAM"], [])
        return bytes(self._agent.get_partial_agent_metadata(empty, True, [self.backend]))

    def partial_metadata(self, regs: Sequence[Registration]) -> bytes:
        """What a peer that already knows this agent needs to reach ``regs`` too."""
        descs = self._agent.get_reg_descs([(r.base, r.size, 0, "") for r in regs], "DRAM")
        return bytes(self._agent.get_partial_agent_metadata(descs, False, [self.backend]))

    def add_peer(self, metadata: bytes, link: bytes) -> str:
        """Load a peer's (full or partial) metadata; its agent name (NIXL's state is per agent, not per link)."""
        try:
            name = self._agent.add_remote_agent(metadata)
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"NIXL could not load the peer's metadata ({type(exc).__name__}: {exc})") from None
        return name.decode() if isinstance(name, bytes) else str(name)

    def drop_peer(self, name: str) -> None:
        try:
            self._agent.remove_remote_agent(name)
        except Exception as exc:  # noqa: BLE001 - already gone, or never loaded
            log.debug("NIXL remove_remote_agent(%s): %s", name, exc)

    # -- registrations --

    def addresses(self, segments: Sequence[Segment]) -> tuple[np.ndarray, list[Registration], list[Registration]]:
        """``(extents, used, new)`` of ``segments`` (``RegistrationTable.extents``), registering what is new."""
        return self._regs.extents(segments)

    def _register(self, handle: MemoryHandle) -> tuple[int, int, Any]:
        view = handle.view()
        if view is None:
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                "the nixl transport moves only memory mapped into the daemon; this cache is worker "
                                "memory reached through a file (unsealed); hand it over sealed, or use transport tcp")
        base = int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
        size = len(view)
        try:
            descs = self._agent.register_memory([(base, size, 0, "")], "DRAM", [self.backend])
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL could not register {size} bytes "
                                                f"({type(exc).__name__}: {exc})") from None
        return base, size, descs

    def _deregister(self, reg: Registration) -> None:
        with self._local_lock:
            lists = self._local.pop(reg.serial, {})
        for prepared in lists.values():   # no READ uses them: it holds the handle the registration is of
            if prepared is not None and not self._closed:
                self.release_rows(prepared)
        if self._closed:
            return
        try:
            self._agent.deregister_memory(reg.token, [self.backend])
        except Exception as exc:  # noqa: BLE001 - deregistered already
            log.debug("NIXL deregister_memory(%#x, %d): %s", reg.base, reg.size, exc)

    def registered(self) -> int:
        return len(self._regs)

    def serials(self) -> set[int]:
        """The registrations ``metadata()`` describes: none (see ``metadata``)."""
        return set()

    # -- published caches: registered per cache, read by prepared descriptor lists --

    def ranges(self, tensors: Sequence[Segment]) -> np.ndarray | None:
        """``(address, length)`` of each tensor in this process (``rows.tensor_ranges``): NIXL moves mapped memory."""
        return tensor_ranges(tensors)

    def publish(self, ranges: np.ndarray) -> tuple[Any, bytes]:
        """Register exactly ``ranges`` (``(address, length)`` rows: one cache's tensors) as one registration of
        their own -- never the pool they lie in -- and answer it with the partial metadata a peer needs to read
        them and nothing else. ``unpublish`` deregisters it."""
        descs = [(int(a), int(n), 0, "") for a, n in ranges]
        try:
            token = self._agent.register_memory(descs, "DRAM", [self.backend])
            metadata = self._agent.get_partial_agent_metadata(self._agent.get_reg_descs(descs, "DRAM"), False,
                                                              [self.backend])
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL could not register a cache of {len(descs)} tensors "
                                                f"({type(exc).__name__}: {exc})") from None
        self._published[id(token)] = token
        return token, bytes(metadata)

    def unpublish(self, token: Any) -> None:
        """Deregister a published cache's memory: on a fabric that checks keys (RDMA), a peer's READ of it fails
        from now on."""
        self._published.pop(id(token), None)
        self._deregister(Registration(0, 0, 0, 0, token))

    def published(self) -> int:
        """Published caches whose memory is registered now."""
        return len(self._published)

    def prepare_rows(self, peer: str, rows: np.ndarray) -> Any:
        """A descriptor list of ``peer``'s rows ``(address, length)``, prepared once (when the peer published
        them): a READ then names rows by index. NIXL checks every row lies in memory the peer described to this
        agent (``nixlNotFoundError`` otherwise)."""
        zeros = np.zeros((len(rows), 1), dtype=np.uint64)
        try:
            return self._agent.prep_xfer_dlist(peer, np.hstack([rows, zeros]), "DRAM", [self.backend])
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL refused the rows {peer} published "
                                                f"({type(exc).__name__}: {exc})") from None

    def release_rows(self, prepared: Any) -> None:
        try:
            self._agent.release_dlist_handle(prepared)
        except Exception as exc:  # noqa: BLE001 - the agent is closing
            log.debug("NIXL release_dlist_handle: %s", exc)

    def read_rows(self, local: np.ndarray, prepared: Any, indices: Sequence[int] | np.ndarray, peer: str, notif: bytes,
                  deadline: float, reg: Registration | None = None) -> None:
        """READ rows ``indices`` of a prepared list of ``peer``'s into ``local`` extents (one for one, of equal
        length), then ``notif`` to the peer; returns at DONE (``post_rows``, then its state checked by C calls --
        no Python frame a check -- napping after ``_SPIN`` checks; ``LLM_TIMEOUT`` at ``deadline``)."""
        request, made, done = self.post_rows(local, prepared, indices, peer, notif, reg)
        try:
            checks = 0
            while not done:
                checks += 1
                if checks > _SPIN:
                    if time.monotonic() >= deadline:
                        ended = self._settle(lambda: self.rows_done(request, peer), deadline, peer)
                        self._given_up("READ", peer, ended)
                    time.sleep(min(_NAP_MAX, 1e-6 * (checks - _SPIN)))
                done = self.rows_done(request, peer)
        finally:
            self.end_rows(request, made, peer)

    def post_rows(self, local: np.ndarray, prepared: Any, indices: Sequence[int] | np.ndarray, peer: str, notif: bytes,
                  reg: Registration | None = None) -> tuple[int, Any, bool]:
        """Post the READ of ``read_rows`` without waiting: ``(request, made, done)`` -- NIXL's request (checked by
        ``rows_done``, released by ``end_rows`` with ``made``, the destination list prepared for this READ alone,
        if any). When every local extent is a row of ``reg`` (the destination's registration) at one stride, the
        destination is rows of a list prepared once per registration (``_local_rows``)."""
        mine = self._local_rows(reg, local) if reg is not None else None
        made = None
        if mine is None:
            zeros = np.zeros((len(local), 1), dtype=np.uint64)
            try:
                made = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.hstack([local, zeros]), "DRAM",
                                                   [self.backend])
            except Exception as exc:  # noqa: BLE001
                raise DataDistError(status_of(exc), f"NIXL refused the destination of a READ from {peer} "
                                                    f"({type(exc).__name__}: {exc})") from None
            mine = (made, list(range(len(local))))
        request = None
        try:
            request = self._raw.makeXferReq(self._read_op, mine[0]._handle, mine[1], prepared._handle,
                                            indices if isinstance(indices, list) else
                                            np.asarray(indices, dtype=np.int32), notif, self._raw_backends, False)
            status = self._raw.postXferReq(request, b"")
        except Exception as exc:  # noqa: BLE001
            self.end_rows(request, made, peer)
            raise DataDistError(status_of(exc), f"NIXL refused the READ from {peer} "
                                                f"({type(exc).__name__}: {exc})") from None
        if status != self._done and status != self._in_prog:
            self.end_rows(request, made, peer)
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"NIXL READ from {peer} failed (status {status})")
        return request, made, status == self._done

    def rows_done(self, request: int, peer: str) -> bool:
        """Whether a posted READ is DONE (one C call); ``LLM_LINK_FAILED`` when it failed."""
        try:
            status = self._raw.getXferStatus(request)
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL READ from {peer} failed ({type(exc).__name__}: "
                                                f"{exc})") from None
        if status == self._in_prog:
            return False
        if status != self._done:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"NIXL READ from {peer} failed (status {status})")
        return True

    def probe(self, peer: str) -> None:
        """A transfer with ``peer`` passed its deadline: send ``wire.PROBE`` on the connection it runs on, so a dead
        one is aborted by this side's kernel (``UCX_TCP_USER_TIMEOUT``) and the transfer ends (a live one delivers it,
        harmlessly)."""
        try:
            self._agent.send_notif(peer, PROBE)
        except Exception as exc:  # noqa: BLE001 - its connection failed already: the transfer ends by itself
            log.debug("NIXL probe of %s: %s", peer, exc)

    def _settle(self, done: Callable[[], bool], deadline: float, peer: str) -> bool:
        """A transfer with ``peer`` passed its ``deadline``: probe its connection and wait up to ``fence`` more for
        it to end (``done()`` true, or raising: it failed); whether it ended -- if not, it may still land."""
        until = deadline + self.fence
        self.probe(peer)
        while True:
            try:
                if done():
                    return True
            except Exception:  # noqa: BLE001 - NIXL's own classes too: it ended, failed
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(0.002)

    @staticmethod
    def _given_up(op: str, peer: str, ended: bool) -> None:
        """Raise the ``LLM_TIMEOUT`` of a transfer that passed its deadline: ``InFlight`` if it had not ``ended``."""
        if ended:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"NIXL {op} with {peer} not done by the deadline")
        raise InFlight(LLMStatusCode.LLM_TIMEOUT, f"NIXL {op} with {peer} not done by the deadline, nor ended within "
                                                  f"the fabric's fence after it")

    def end_rows(self, request: int | None, made: Any, peer: str) -> None:
        """Release a READ's request (in flight: NIXL aborts it) and its per-READ destination list."""
        if request is not None and not self._closed:
            try:
                self._raw.releaseXferReq(request)
            except Exception as exc:  # noqa: BLE001 - releasing a request still in flight may refuse
                log.warning("NIXL could not release a READ from %s: %s", peer, exc)
        if made is not None:
            self.release_rows(made)

    def _local_rows(self, reg: Registration, local: np.ndarray) -> tuple[Any, list[int]] | None:
        """``(prepared list, indices)`` of ``local`` extents as rows of ``reg`` prepared once: every extent of one
        length, at one phase from ``reg.base``, inside ``reg``; None when they are not (or ``reg`` has too many
        rows, or geometries)."""
        extents = local.tolist()
        if not extents:
            return None
        size = extents[0][1]
        if size <= 0:
            return None
        base, end = reg.base, reg.base + reg.size
        phase = (extents[0][0] - base) % size
        indices = []
        for addr, length in extents:
            at = addr - base - phase
            if length != size or at < 0 or at % size or addr + length > end:
                return None
            indices.append(at // size)
        key = (size, phase)
        with self._local_lock:
            lists = self._local.get(reg.serial)
            prepared = lists.get(key, False) if lists is not None else False
        if prepared is False:
            count = (reg.size - phase) // size
            prepared = None
            if count <= _LOCAL_ROWS_MAX and (lists is None or len(lists) < _LOCAL_LISTS_MAX):
                rows = np.zeros((count, 3), dtype=np.uint64)
                rows[:, 0] = np.uint64(base + phase) + np.arange(count, dtype=np.uint64) * np.uint64(size)
                rows[:, 1] = size
                try:
                    prepared = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", rows, "DRAM", [self.backend])
                except Exception as exc:  # noqa: BLE001 - prepared per READ instead (which reports it)
                    log.debug("NIXL could not prepare the rows of a destination: %s", exc)
            with self._local_lock:   # another READ may have prepared it meanwhile: one list is kept
                lists = self._local.setdefault(reg.serial, {})
                kept = lists.setdefault(key, prepared)
            if kept is not prepared and prepared is not None:
                self.release_rows(prepared)
            prepared = kept
        if prepared is None:
            return None
        return prepared, indices

    # -- transfers --

    def write(self, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes, deadline: float,
              stop: Callable[[], DataDistError | None]) -> None:
        """WRITE extents ``local`` (this agent's) to extents ``remote`` (``peer``'s), extent for extent of equal length,
        then have NIXL deliver ``notif`` to the peer -- *after* the bytes: it is the peer's only proof they
        landed (the local DONE means the request left, not that every byte arrived). Returns at DONE.
        ``stop()`` is asked while it runs: an error it returns ends the transfer (released) and is raised;
        so is ``LLM_TIMEOUT`` at ``deadline``."""
        self._xfer("WRITE", local, remote, peer, notif, deadline, stop)

    def read(self, local: np.ndarray, remote: np.ndarray, peer: str, deadline: float) -> None:
        """READ ``peer``'s extents ``remote`` into this agent's extents ``local``; returns at DONE (every byte is in
        local memory: a READ completes where its bytes land). ``LLM_TIMEOUT`` at ``deadline``."""
        self._xfer("READ", local, remote, peer, b"", deadline, lambda: None)

    def _xfer(self, op: str, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes, deadline: float,
              stop: Callable[[], DataDistError | None]) -> None:
        zeros = np.zeros((len(local), 1), dtype=np.uint64)
        try:
            handle = self._agent.initialize_xfer(
                op, self._agent.get_xfer_descs(np.hstack([local, zeros]), "DRAM"),
                self._agent.get_xfer_descs(np.hstack([remote, zeros]), "DRAM"), peer, notif)
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL refused the {op} with {peer} "
                                                f"({type(exc).__name__}: {exc})") from None
        self._run(op, handle, peer, deadline, stop)

    def _run(self, op: str, handle: Any, peer: str, deadline: float, stop: Callable[[], DataDistError | None]) -> None:
        """Post ``handle`` and poll it to DONE (``LLM_TIMEOUT`` at ``deadline``; ``stop()``'s error ends it); the
        request is released either way."""
        try:
            state = self._agent.transfer(handle)
            checks = 0
            while state == "PROC":
                checks += 1
                if checks > _SPIN:
                    if time.monotonic() >= deadline:
                        self._given_up(op, peer, self._settle(lambda: self._agent.check_xfer_state(handle) != "PROC",
                                                              deadline, peer))
                    reason = stop()
                    if reason is not None:
                        raise reason
                    time.sleep(min(_NAP_MAX, 1e-6 * (checks - _SPIN)))
                state = self._agent.check_xfer_state(handle)
            if state != "DONE":
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"NIXL {op} with {peer} failed (state {state})")
        except DataDistError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL {op} with {peer} failed ({type(exc).__name__}: "
                                                f"{exc})") from None
        finally:
            try:
                handle.release()
            except Exception as exc:  # noqa: BLE001 - releasing a request still in flight may refuse
                log.warning("NIXL could not release a %s with %s: %s", op, peer, exc)

    def notify(self, peer: str, message: bytes) -> None:
        """A notification with no transfer (an empty one has nothing to wait for)."""
        try:
            self._agent.send_notif(peer, message)
        except Exception as exc:  # noqa: BLE001
            raise DataDistError(status_of(exc), f"NIXL notification to {peer} failed ({type(exc).__name__}: "
                                                f"{exc})") from None

    def notifications(self) -> list[tuple[str, bytes]]:
        """Notifications that arrived since the last call: ``(peer agent name, message)``."""
        try:
            got = self._agent.get_new_notifs()
        except Exception as exc:  # noqa: BLE001
            log.warning("NIXL get_new_notifs failed: %s", exc)
            return []
        out: list[tuple[str, bytes]] = []
        for name, messages in got.items():
            peer = name.decode() if isinstance(name, bytes) else str(name)
            out.extend((peer, bytes(m)) for m in messages)
        return out

    def close(self) -> None:
        self._regs.close()
        for token in list(self._published.values()):
            self.unpublish(token)
        self._closed = True
