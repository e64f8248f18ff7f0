"""CANN's HIXL engine API in Python -- the counterpart of CANN's pybind module ``hixl.hixl``
(hicann/hixl src/python/hixl_py/hixl_py.cc), over datadistd (docs/hixl.md).

The same names, constants, enums, data classes, method names, keyword names, defaults and return shapes: a call
returns HIXL's status (an ``int``), or a tuple of the status and a value; a call the engine refuses returns its
status and never raises. As with the pybind module, an argument of the wrong type raises ``TypeError`` before
anything runs, and a call on an engine that is not initialized returns ``FAILED``.
"""

from __future__ import annotations

import enum
import logging
import threading
from types import MappingProxyType
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Sequence, Tuple, TypeVar, overload

from datadist.hixl import (
    ALREADY_CONNECTED,
    FAILED,
    MAX_NOTIFY_MSG_LEN,
    MAX_NOTIFY_NAME_LEN,
    NOT_CONNECTED,
    NOTIFY_FAILED,
    PARAM_INVALID,
    RESOURCE_EXHAUSTED,
    SUCCESS,
    TIMEOUT,
    UNSUPPORTED,
)
from llm_datadist.status import LLMException

from . import _connect_pool as _pool
from . import _engine
from . import _options as _opt
from . import _requests as _req

__all__ = [
    "SUCCESS", "PARAM_INVALID", "TIMEOUT", "NOT_CONNECTED", "ALREADY_CONNECTED", "NOTIFY_FAILED", "UNSUPPORTED",
    "FAILED", "RESOURCE_EXHAUSTED", "OPTION_ENABLE_USE_FABRIC_MEM", "OPTION_RDMA_TRAFFIC_CLASS",
    "OPTION_RDMA_SERVICE_LEVEL", "OPTION_BUFFER_POOL", "OPTION_GLOBAL_RESOURCE_CONFIG", "OPTION_AUTO_CONNECT",
    "OPTION_LOCAL_COMM_RES", "FEATURE_SUPPORTED", "FEATURE_NOT_SUPPORTED", "MemType", "MEM_DEVICE", "MEM_HOST",
    "TransferOp", "READ", "WRITE", "TransferStatus", "AsyncConnectStatus", "NOT_CONNECT", "CONNECT_PENDING",
    "CONNECTING", "CONNECTED", "CONNECT_FAILED", "DISCONNECT_PENDING", "DISCONNECTING", "FeatureType",
    "AUTO_CONNECT", "CLIENT_SERVER_COMM", "MemDesc", "TransferOpDesc", "TransferArgs", "GetTransferStatusArgs",
    "TransferResult", "NotifyDesc", "Hixl", "get_capability",
]

log = logging.getLogger(__name__)

# ---- constants (hixl_types.h) --------------------------------------------------------------------

OPTION_ENABLE_USE_FABRIC_MEM = _opt.ENABLE_USE_FABRIC_MEM
OPTION_RDMA_TRAFFIC_CLASS = _opt.RDMA_TRAFFIC_CLASS
OPTION_RDMA_SERVICE_LEVEL = _opt.RDMA_SERVICE_LEVEL
OPTION_BUFFER_POOL = _opt.BUFFER_POOL
OPTION_GLOBAL_RESOURCE_CONFIG = _opt.GLOBAL_RESOURCE_CONFIG
OPTION_AUTO_CONNECT = _opt.AUTO_CONNECT
OPTION_LOCAL_COMM_RES = _opt.LOCAL_COMM_RES

FEATURE_SUPPORTED = 1
FEATURE_NOT_SUPPORTED = 0

_DEFAULT_TIMEOUT_MS = 1000   # hixl_py.cc kDefaultTimeoutMs
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_INT32 = (-(2**31), 2**31 - 1)


# ---- enums ---------------------------------------------------------------------------------------
# pybind11 makes an unscoped C++ enum (MemType, TransferOp, FeatureType) compare equal to its int value, and a scoped
# one (``enum class``: TransferStatus, AsyncConnectStatus) equal only to itself; both convert with int().


class MemType(enum.IntEnum):
    """Where registered memory is: ``MEM_DEVICE`` (0, NPU memory) or ``MEM_HOST`` (1)."""

    MEM_DEVICE = _engine.MEM_DEVICE
    MEM_HOST = _engine.MEM_HOST


class TransferOp(enum.IntEnum):
    """``READ`` (0: remote memory into local) or ``WRITE`` (1: local memory to remote)."""

    READ = _engine.READ
    WRITE = _engine.WRITE


class FeatureType(enum.IntEnum):
    """What ``get_capability`` is asked about: ``AUTO_CONNECT`` (0), ``CLIENT_SERVER_COMM`` (1)."""

    AUTO_CONNECT = 0
    CLIENT_SERVER_COMM = 1


class _ScopedEnum(enum.Enum):
    """A scoped C++ enum as pybind11 gives it: equal only to itself, ``int()`` gives its value."""

    def __int__(self) -> int:
        return int(self.value)

    def __index__(self) -> int:
        return int(self.value)


class TransferStatus(_ScopedEnum):
    """An async transfer's status: ``WAITING`` (0), then once ``COMPLETED`` (1), ``TIMEOUT`` (2) or ``FAILED`` (3)."""

    WAITING = _req.WAITING
    COMPLETED = _req.COMPLETED
    TIMEOUT = _req.TIMED_OUT
    FAILED = _req.FAILED_


class AsyncConnectStatus(_ScopedEnum):
    """A remote engine's status in ``connect_async`` / ``disconnect_async``'s pool."""

    NOT_CONNECT = _pool.NOT_CONNECT
    CONNECT_PENDING = _pool.CONNECT_PENDING
    CONNECTING = _pool.CONNECTING
    CONNECTED = _pool.CONNECTED
    CONNECT_FAILED = _pool.CONNECT_FAILED
    DISCONNECT_PENDING = _pool.DISCONNECT_PENDING
    DISCONNECTING = _pool.DISCONNECTING


# export_values(), as the pybind module does (TransferStatus's are not exported)
MEM_DEVICE = MemType.MEM_DEVICE
MEM_HOST = MemType.MEM_HOST
READ = TransferOp.READ
WRITE = TransferOp.WRITE
AUTO_CONNECT = FeatureType.AUTO_CONNECT
CLIENT_SERVER_COMM = FeatureType.CLIENT_SERVER_COMM
NOT_CONNECT = AsyncConnectStatus.NOT_CONNECT
CONNECT_PENDING = AsyncConnectStatus.CONNECT_PENDING
CONNECTING = AsyncConnectStatus.CONNECTING
CONNECTED = AsyncConnectStatus.CONNECTED
CONNECT_FAILED = AsyncConnectStatus.CONNECT_FAILED
DISCONNECT_PENDING = AsyncConnectStatus.DISCONNECT_PENDING
DISCONNECTING = AsyncConnectStatus.DISCONNECTING


# ---- argument checks: pybind11's conversions, TypeError when one fails ---------------------------

def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or not lo <= value <= hi:
        raise TypeError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def _uint64(name: str, value: Any) -> int:
    return _int(name, value, 0, _UINT64_MAX)


def _timeout(value: Any) -> int:
    return _int("timeout_in_millis", value, *_INT32)


def _of(name: str, value: Any, cls: type) -> Any:
    if not isinstance(value, cls):
        raise TypeError(f"{name}: expected {cls.__name__}, got {type(value).__name__}")
    return value


# ---- data classes --------------------------------------------------------------------------------

_T = TypeVar("_T")


class _Field(Generic[_T]):
    """A read-write attribute of a data class, converted on every set as pybind11 converts it (``TypeError``
    otherwise), kept in the instance's ``_<name>`` slot; ``read_only`` makes it ``def_readonly``."""

    def __init__(self, convert: Callable[[str, Any], _T], doc: str, read_only: bool = False) -> None:
        self._convert = convert
        self._read_only = read_only
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name, self._slot = name, "_" + name

    @overload
    def __get__(self, obj: None, owner: type) -> "_Field[_T]": ...

    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...

    def __get__(self, obj: Optional[object], owner: type) -> Any:
        return self if obj is None else getattr(obj, self._slot)

    def __set__(self, obj: object, value: Any) -> None:
        if self._read_only:
            raise AttributeError(f"{type(obj).__name__}.{self._name} is read-only")
        object.__setattr__(obj, self._slot, self._convert(self._name, value))


def _str(name: str, value: Any) -> str:
    return str(_of(name, value, str))


def _bool(name: str, value: Any) -> bool:
    return bool(_of(name, value, bool))


def _uint32(name: str, value: Any) -> int:
    return _int(name, value, 0, _UINT32_MAX)


class MemDesc:
    """A memory range to register: ``addr`` (uintptr) and ``len`` (bytes)."""

    __slots__ = ("_addr", "_len")
    addr = _Field(_uint64, "The range's first address (uintptr).")
    len = _Field(_uint64, "The range's length in bytes.")

    def __init__(self, addr: int, len: int) -> None:  # noqa: A002 - CANN's keyword
        self.addr = addr
        self.len = len

    def __repr__(self) -> str:
        return f"MemDesc(addr=0x{self.addr:x}, len={self.len})"


class TransferOpDesc:
    """One extent of a transfer: ``len`` bytes at ``local_addr`` (this engine's registered memory) and
    ``remote_addr`` (the remote engine's)."""

    __slots__ = ("_local_addr", "_remote_addr", "_len")
    local_addr = _Field(_uint64, "The extent's address in this process (uintptr).")
    remote_addr = _Field(_uint64, "The extent's address in the remote engine's process (uintptr).")
    len = _Field(_uint64, "The extent's length in bytes.")

    def __init__(self, local_addr: int, remote_addr: int, len: int) -> None:  # noqa: A002 - CANN's keyword
        self.local_addr = local_addr
        self.remote_addr = remote_addr
        self.len = len

    def __repr__(self) -> str:
        return f"TransferOpDesc(local_addr=0x{self.local_addr:x}, remote_addr=0x{self.remote_addr:x}, len={self.len})"


class TransferArgs:
    """The optional arguments of ``transfer_async``: ``user_data`` (a uintptr, 0 by default), given back in its
    ``TransferResult``."""

    __slots__ = ("_user_data",)
    user_data = _Field(_uint64, "A number of the caller's (uintptr), given back in the request's TransferResult.")

    def __init__(self) -> None:
        self.user_data = 0


class GetTransferStatusArgs:
    """The arguments of ``get_all_transfer_status``: at most ``max_query_count`` results (uint32, default all),
    ``skip_waiting`` leaves out the requests still waiting."""

    __slots__ = ("_max_query_count", "_skip_waiting")
    max_query_count = _Field(_uint32, "At most this many results (uint32; 0: none).")
    skip_waiting = _Field(_bool, "Leave out (and do not count) the requests still waiting.")

    def __init__(self, max_query_count: int = _UINT32_MAX, skip_waiting: bool = False) -> None:
        self.max_query_count = max_query_count
        self.skip_waiting = skip_waiting


class TransferResult:
    """An async request's result: ``req``, its ``user_data`` and its ``status`` (read-only)."""

    __slots__ = ("_req", "_user_data", "_status")
    req = _Field(_uint64, "The request, as transfer_async returned it.")
    user_data = _Field(_uint64, "The request's TransferArgs.user_data.")
    status: _Field[TransferStatus] = _Field(lambda n, v: TransferStatus(v), "The request's TransferStatus.",
                                            read_only=True)

    def __init__(self) -> None:
        """req 0, user_data 0, WAITING."""
        self.req = 0
        self.user_data = 0
        self._status = TransferStatus.WAITING

    @classmethod
    def _of(cls, req: int, user_data: int, status: int) -> "TransferResult":
        result = cls()
        result.req, result.user_data, result._status = req, user_data, TransferStatus(status)
        return result

    def __repr__(self) -> str:
        return f"TransferResult(req={self.req}, user_data={self.user_data}, status={self.status})"


class NotifyDesc:
    """A notify: its ``name`` and ``notify_msg`` (each at most 1024 bytes in UTF-8)."""

    __slots__ = ("_name", "_notify_msg")
    name = _Field(_str, "The notify's name.")
    notify_msg = _Field(_str, "The notify's message.")

    def __init__(self, name: str, notify_msg: str) -> None:
        self.name = name
        self.notify_msg = notify_msg

    def __repr__(self) -> str:
        return f"NotifyDesc(name={self.name!r}, notify_msg={self.notify_msg!r})"


def _descs(op_descs: Any) -> List[Tuple[int, int, int]]:
    if isinstance(op_descs, (str, bytes)) or not isinstance(op_descs, Sequence):
        raise TypeError(f"op_descs: expected a list of TransferOpDesc, got {type(op_descs).__name__}")
    out = []
    for d in op_descs:
        if type(d) is not TransferOpDesc:
            _of("op_descs element", d, TransferOpDesc)
        out.append((d.local_addr, d.remote_addr, d.len))
    return out


_NO_OPTIONS: Mapping[str, str] = MappingProxyType({})


class Hixl:
    """A HIXL engine: ``initialize`` it with its local engine string, register memory, connect to remote engines,
    READ and WRITE lists of extents with them, send and receive notifies; ``finalize`` ends it."""

    def __init__(self) -> None:
        """An engine not yet initialized: every call but ``initialize`` returns ``FAILED``."""
        self._lock = threading.Lock()
        self._engine: Optional[_engine.HixlEngine] = None

    def initialize(self, local_engine: str, options: Mapping[str, str] = _NO_OPTIONS) -> int:
        """Create the engine on datadistd (``DATADIST_DAEMON``, or the ``datadist.daemon`` option, else an embedded
        daemon), listening at ``local_engine`` when it names a port.

        Args:
            local_engine: "ip", "ip:port", "[ipv6]" or "[ipv6]:port"; with a port remote engines can connect to it.
            options: ``OPTION_*`` keys to string values (docs/hixl.md says what each does here).

        Returns:
            SUCCESS (also when already initialized: the call is ignored), PARAM_INVALID (a bad engine string or
            option), or the daemon's refusal (FAILED when no daemon is reachable).
        """
        _of("local_engine", local_engine, str)
        if not isinstance(options, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in options.items()):
            raise TypeError("options: expected a dict of str to str")
        with self._lock:
            if self._engine is not None:
                log.info("initialize: already initialized, ignoring repeated call")
                return SUCCESS
            try:
                self._engine = _engine.HixlEngine(local_engine, _opt.parse_options(options))
            except _opt.Refused as exc:
                log.error("initialize: %s", exc)
                return exc.status
            except ValueError as exc:
                log.error("initialize: local engine %s", exc)
                return PARAM_INVALID
            except LLMException as exc:
                log.error("initialize: failed for engine %r: %s", local_engine, exc)
                return _engine.hixl_status(int(exc.status_code))
        return SUCCESS

    def finalize(self) -> None:
        """End the engine: its connections, registrations and requests go; a no-op when not initialized."""
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.finalize()

    def register_mem(self, mem_desc: MemDesc, mem_type: MemType, /) -> Tuple[int, int]:
        """Register ``mem_desc`` (this process's memory) so transfers may name it.

        Returns:
            (status, handle): the handle (non-zero) is for ``deregister_mem``; the same range and type again gives the
            same handle; PARAM_INVALID for a null address or a range overlapping another registration of the type.
        """
        _of("mem_desc", mem_desc, MemDesc)
        _of("mem_type", mem_type, MemType)
        engine = self._engine
        if engine is None:
            return FAILED, 0
        return engine.register_mem(mem_desc.addr, mem_desc.len, int(mem_type))

    def deregister_mem(self, mem_handle: int, /) -> int:
        """End a registration: SUCCESS (an unknown handle too), PARAM_INVALID (0), FAILED while this engine is
        connected to any remote engine (HIXL: disconnect first)."""
        handle = _uint64("mem_handle", mem_handle)
        engine = self._engine
        if engine is None:
            return FAILED
        return engine.deregister_mem(handle)

    def connect(self, remote_engine: str, timeout_in_millis: int = _DEFAULT_TIMEOUT_MS) -> int:
        """Connect to ``remote_engine`` ("ip:port" of a listening engine) within ``timeout_in_millis``.

        Returns:
            SUCCESS, ALREADY_CONNECTED, PARAM_INVALID (timeout <= 0, itself, a bad or port-less engine string),
            TIMEOUT, or FAILED (nothing listens there).
        """
        engine, code, timeout = self._timed(remote_engine, timeout_in_millis)
        return code if engine is None else engine.connect(remote_engine, timeout)

    def disconnect(self, remote_engine: str, timeout_in_millis: int = _DEFAULT_TIMEOUT_MS) -> int:
        """End the connection to ``remote_engine``: SUCCESS, NOT_CONNECTED, PARAM_INVALID (timeout <= 0). Its async
        requests are forgotten."""
        engine, code, timeout = self._timed(remote_engine, timeout_in_millis)
        return code if engine is None else engine.disconnect(remote_engine, timeout)

    def _timed(self, remote_engine: str, timeout_in_millis: int) -> Tuple[Optional[_engine.HixlEngine], int, int]:
        """(engine, status, timeout) of a call with a remote engine and a timeout: the engine None with FAILED (not
        initialized) or PARAM_INVALID (timeout <= 0), checked in hixl_py.cc's and hixl_impl.cc's order."""
        _of("remote_engine", remote_engine, str)
        timeout = _timeout(timeout_in_millis)
        engine = self._engine
        if engine is None:
            return None, FAILED, timeout
        if timeout <= 0:
            return None, PARAM_INVALID, timeout
        return engine, SUCCESS, timeout

    def _submit(self, remote_engine: str, timeout_in_millis: int, is_connect: bool) -> int:
        engine, code, timeout = self._timed(remote_engine, timeout_in_millis)
        return code if engine is None else engine.pool.submit(remote_engine, timeout, is_connect)

    def connect_async(self, remote_engine: str, timeout_in_millis: int = _DEFAULT_TIMEOUT_MS) -> int:
        """Queue a connect to ``remote_engine``; ``get_async_connect_status`` follows it.

        Returns:
            SUCCESS (queued), PARAM_INVALID (timeout <= 0), RESOURCE_EXHAUSTED (the queue is full).
        """
        return self._submit(remote_engine, timeout_in_millis, True)

    def disconnect_async(self, remote_engine: str, timeout_in_millis: int = _DEFAULT_TIMEOUT_MS) -> int:
        """Queue a disconnect from ``remote_engine``: SUCCESS, PARAM_INVALID (timeout <= 0), RESOURCE_EXHAUSTED."""
        return self._submit(remote_engine, timeout_in_millis, False)

    def get_async_connect_status(self, remote_engine: str, /) -> Tuple[int, AsyncConnectStatus]:
        """(status, the ``AsyncConnectStatus`` of ``remote_engine``; NOT_CONNECT when it has none)."""
        _of("remote_engine", remote_engine, str)
        engine = self._engine
        if engine is None:
            return FAILED, AsyncConnectStatus.NOT_CONNECT
        return SUCCESS, AsyncConnectStatus(engine.pool.status(remote_engine))

    def get_all_async_connect_status(self) -> Tuple[int, Dict[str, AsyncConnectStatus]]:
        """(status, {remote engine: ``AsyncConnectStatus``}) of every remote engine with a status."""
        engine = self._engine
        if engine is None:
            return FAILED, {}
        return SUCCESS, {k: AsyncConnectStatus(v) for k, v in engine.pool.statuses().items()}

    def transfer_sync(self, remote_engine: str, op: TransferOp, op_descs: Sequence[TransferOpDesc],
                      timeout_in_millis: int = _DEFAULT_TIMEOUT_MS) -> int:
        """READ (remote into local) or WRITE (local to remote) the extents ``op_descs``, and wait.

        Returns:
            SUCCESS once every byte has moved; PARAM_INVALID (timeout <= 0, a null address, no extents, an extent not
            wholly inside a registration on either side: nothing is moved), NOT_CONNECTED (not connected, without
            AutoConnect), TIMEOUT, FAILED.
        """
        _of("op", op, TransferOp)
        descs = _descs(op_descs)
        engine, code, timeout = self._timed(remote_engine, timeout_in_millis)
        return code if engine is None else engine.transfer_sync(remote_engine, int(op), descs, timeout)

    def transfer_async(self, remote_engine: str, op: TransferOp, op_descs: Sequence[TransferOpDesc],
                       args: Optional[TransferArgs] = None) -> Tuple[int, int]:
        """Start a transfer as ``transfer_sync`` does, without waiting (``args``: None is ``TransferArgs()``).

        Returns:
            (status, req): ``req`` (non-zero) for ``get_transfer_status``; a refusal as ``transfer_sync``'s
            (a failure of the transfer itself shows in its status).
        """
        _of("remote_engine", remote_engine, str)
        _of("op", op, TransferOp)
        descs = _descs(op_descs)
        user_data = 0 if args is None else _of("args", args, TransferArgs).user_data
        engine = self._engine
        if engine is None:
            return FAILED, 0
        return engine.transfer_async(remote_engine, int(op), descs, user_data)

    def get_transfer_status(self, req: int, /) -> Tuple[int, TransferStatus]:
        """(status, ``TransferStatus``) of ``req``; once reported finished it is forgotten: then (PARAM_INVALID,
        FAILED), as for a request never made or dropped by a disconnect; (FAILED, FAILED) for 0."""
        request = _uint64("req", req)
        engine = self._engine
        if engine is None or request == 0:
            return FAILED, TransferStatus.FAILED
        code, status = engine.requests.status(request)
        return code, TransferStatus(status)

    def get_all_transfer_status(self, args: Optional[GetTransferStatusArgs] = None
                                ) -> Tuple[int, List[TransferResult]]:
        """(status, [``TransferResult``]) of the requests in the order they were made, at most
        ``args.max_query_count``, without the waiting ones when ``args.skip_waiting``; the finished ones reported are
        forgotten (``args``: None is ``GetTransferStatusArgs()``)."""
        query = GetTransferStatusArgs() if args is None else _of("args", args, GetTransferStatusArgs)
        engine = self._engine
        if engine is None:
            return FAILED, []
        found = engine.requests.collect(query.max_query_count, query.skip_waiting)
        return SUCCESS, [TransferResult._of(*r) for r in found]

    def send_notify(self, remote_engine: str, notify: NotifyDesc,
                    timeout_in_millis: int = _DEFAULT_TIMEOUT_MS) -> int:
        """Queue ``notify`` at the connected ``remote_engine``.

        Returns:
            SUCCESS, PARAM_INVALID (a name or message over 1024 bytes, timeout <= 0), NOT_CONNECTED,
            RESOURCE_EXHAUSTED (the remote engine's queue is full: 4096 notifies not yet taken), TIMEOUT, FAILED.
        """
        _of("remote_engine", remote_engine, str)
        _of("notify", notify, NotifyDesc)
        timeout = _timeout(timeout_in_millis)
        engine = self._engine
        if engine is None:
            return FAILED
        name, msg = notify.name.encode(), notify.notify_msg.encode()
        if len(name) > MAX_NOTIFY_NAME_LEN or timeout <= 0 or len(msg) > MAX_NOTIFY_MSG_LEN:
            return PARAM_INVALID
        return engine.send_notify(remote_engine, name, msg, timeout)

    def get_notifies(self) -> Tuple[int, List[NotifyDesc]]:
        """(status, [``NotifyDesc``]) this engine received, oldest first; taken (a second call gives the newer)."""
        engine = self._engine
        if engine is None:
            return FAILED, []
        code, found = engine.get_notifies()
        return code, [NotifyDesc(n.decode("utf-8", "replace"), m.decode("utf-8", "replace")) for n, m in found]


def get_capability(feature_type: FeatureType, /) -> Tuple[int, int]:
    """(SUCCESS, FEATURE_SUPPORTED) for ``AUTO_CONNECT`` and ``CLIENT_SERVER_COMM``: both are supported."""
    _of("feature_type", feature_type, FeatureType)
    return SUCCESS, FEATURE_SUPPORTED if feature_type in (AUTO_CONNECT, CLIENT_SERVER_COMM) else FEATURE_NOT_SUPPORTED

