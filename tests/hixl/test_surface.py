"""The ``hixl`` package's surface pinned against CANN's (hicann/hixl src/python/hixl_py/hixl/__init__.py and
hixl_py.cc), and the pieces that decide statuses without a daemon: the options (hixl_options.cc), the connect pool
(connect_pool_executor.cc) and the async request table (hixl_engine.cc GetTransferStatus)."""

from __future__ import annotations

import inspect
import threading

import pytest

import hixl
from hixl import _connect_pool, _requests
from hixl._options import Refused, parse_options
from llm_datadist.status import LLMException, LLMStatusCode

#: CANN's hixl/__init__.py __all__, in its order
CANN_ALL = [
    "SUCCESS", "PARAM_INVALID", "TIMEOUT", "NOT_CONNECTED", "ALREADY_CONNECTED", "NOTIFY_FAILED", "UNSUPPORTED",
    "FAILED", "RESOURCE_EXHAUSTED", "OPTION_ENABLE_USE_FABRIC_MEM", "OPTION_RDMA_TRAFFIC_CLASS",
    "OPTION_RDMA_SERVICE_LEVEL", "OPTION_BUFFER_POOL", "OPTION_GLOBAL_RESOURCE_CONFIG", "OPTION_AUTO_CONNECT",
    "OPTION_LOCAL_COMM_RES", "FEATURE_SUPPORTED", "FEATURE_NOT_SUPPORTED", "MemType", "MEM_DEVICE", "MEM_HOST",
    "TransferOp", "READ", "WRITE", "TransferStatus", "AsyncConnectStatus", "NOT_CONNECT", "CONNECT_PENDING",
    "CONNECTING", "CONNECTED", "CONNECT_FAILED", "DISCONNECT_PENDING", "DISCONNECTING", "FeatureType",
    "AUTO_CONNECT", "CLIENT_SERVER_COMM", "MemDesc", "TransferOpDesc", "TransferArgs", "GetTransferStatusArgs",
    "TransferResult", "NotifyDesc", "Hixl", "get_capability",
]

P, K = inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
E = inspect.Parameter.empty
#: hixl_py.cc RegisterHixlEngine: (name, kind, default) of each method's parameters after self; a method bound
#: without py::arg takes its arguments by position only
CANN_METHODS = {
    "initialize": [("local_engine", K, E), ("options", K, {})],
    "finalize": [],
    "register_mem": [("mem_desc", P, E), ("mem_type", P, E)],
    "deregister_mem": [("mem_handle", P, E)],
    "connect": [("remote_engine", K, E), ("timeout_in_millis", K, 1000)],
    "disconnect": [("remote_engine", K, E), ("timeout_in_millis", K, 1000)],
    "connect_async": [("remote_engine", K, E), ("timeout_in_millis", K, 1000)],
    "disconnect_async": [("remote_engine", K, E), ("timeout_in_millis", K, 1000)],
    "get_async_connect_status": [("remote_engine", P, E)],
    "get_all_async_connect_status": [],
    "transfer_sync": [("remote_engine", K, E), ("op", K, E), ("op_descs", K, E), ("timeout_in_millis", K, 1000)],
    "transfer_async": [("remote_engine", K, E), ("op", K, E), ("op_descs", K, E), ("args", K, "TransferArgs()")],
    "get_transfer_status": [("req", P, E)],
    "get_all_transfer_status": [("args", K, "GetTransferStatusArgs()")],
    "send_notify": [("remote_engine", K, E), ("notify", K, E), ("timeout_in_millis", K, 1000)],
    "get_notifies": [],
}


def test_all_is_canns() -> None:
    assert hixl.__all__ == CANN_ALL
    for name in CANN_ALL:
        assert getattr(hixl, name) is getattr(hixl.hixl, name)
        assert (getattr(hixl, name).__doc__ or "").strip() or not callable(getattr(hixl, name)), name


def test_constants_and_enums() -> None:
    assert (hixl.SUCCESS, hixl.PARAM_INVALID, hixl.TIMEOUT, hixl.NOT_CONNECTED, hixl.ALREADY_CONNECTED,
            hixl.NOTIFY_FAILED, hixl.UNSUPPORTED, hixl.FAILED, hixl.RESOURCE_EXHAUSTED) == \
        (0, 103900, 103901, 103902, 103903, 103904, 103905, 503900, 203900)
    assert (hixl.OPTION_ENABLE_USE_FABRIC_MEM, hixl.OPTION_RDMA_TRAFFIC_CLASS, hixl.OPTION_RDMA_SERVICE_LEVEL,
            hixl.OPTION_BUFFER_POOL, hixl.OPTION_GLOBAL_RESOURCE_CONFIG, hixl.OPTION_AUTO_CONNECT,
            hixl.OPTION_LOCAL_COMM_RES) == ("EnableUseFabricMem", "RdmaTrafficClass", "RdmaServiceLevel",
                                            "BufferPool", "GlobalResourceConfig", "AutoConnect", "LocalCommRes")
    assert (hixl.FEATURE_SUPPORTED, hixl.FEATURE_NOT_SUPPORTED) == (1, 0)
    # unscoped C++ enums compare equal to their values, as pybind11 makes them; scoped ones only to themselves
    assert (hixl.MEM_DEVICE, hixl.MEM_HOST, hixl.READ, hixl.WRITE, hixl.AUTO_CONNECT, hixl.CLIENT_SERVER_COMM) == \
        (0, 1, 0, 1, 0, 1)
    assert [int(s) for s in hixl.TransferStatus] == [0, 1, 2, 3]
    assert [s.name for s in hixl.TransferStatus] == ["WAITING", "COMPLETED", "TIMEOUT", "FAILED"]
    assert hixl.TransferStatus.WAITING != 0 and not hasattr(hixl, "WAITING")
    assert [int(s) for s in hixl.AsyncConnectStatus] == list(range(7))
    assert [s.name for s in hixl.AsyncConnectStatus] == ["NOT_CONNECT", "CONNECT_PENDING", "CONNECTING", "CONNECTED",
                                                         "CONNECT_FAILED", "DISCONNECT_PENDING", "DISCONNECTING"]
    assert hixl.CONNECTED is hixl.AsyncConnectStatus.CONNECTED


def test_signatures() -> None:
    for name, params in CANN_METHODS.items():
        method = getattr(hixl.Hixl, name)
        assert (method.__doc__ or "").strip(), name
        got = list(inspect.signature(method).parameters.values())[1:]
        assert [(p.name, p.kind) for p in got] == [(n, k) for n, k, _ in params], name
        for p, (_, _, default) in zip(got, params, strict=True):
            if default == "TransferArgs()":
                assert p.default is None   # None stands for a fresh TransferArgs() (no shared mutable default)
            elif default == "GetTransferStatusArgs()":
                assert p.default is None
            else:
                assert p.default == default, name
    cap = list(inspect.signature(hixl.get_capability).parameters.values())
    assert [(p.name, p.kind) for p in cap] == [("feature_type", P)]


def test_data_classes() -> None:
    desc = hixl.MemDesc(addr=0x1000, len=8192)
    assert (desc.addr, desc.len) == (0x1000, 8192)
    desc.addr = 0x2000
    assert desc.addr == 0x2000
    op = hixl.TransferOpDesc(local_addr=1, remote_addr=2, len=3)
    assert (op.local_addr, op.remote_addr, op.len) == (1, 2, 3)
    args = hixl.TransferArgs()
    assert args.user_data == 0
    args.user_data = 123
    assert args.user_data == 123
    q = hixl.GetTransferStatusArgs()
    assert (q.max_query_count, q.skip_waiting) == (2**32 - 1, False)
    q = hixl.GetTransferStatusArgs(max_query_count=100, skip_waiting=True)
    assert (q.max_query_count, q.skip_waiting) == (100, True)
    result = hixl.TransferResult()
    assert (result.req, result.user_data, result.status) == (0, 0, hixl.TransferStatus.WAITING)
    with pytest.raises(AttributeError):
        result.status = hixl.TransferStatus.COMPLETED  # type: ignore[misc]
    n = hixl.NotifyDesc(name="signal", notify_msg="hello")
    n.name = "updated"
    assert (n.name, n.notify_msg) == ("updated", "hello")
    # pybind11 refuses what does not convert, before any call
    for bad in (lambda: hixl.MemDesc(-1, 1), lambda: hixl.MemDesc(1.5, 1), lambda: hixl.TransferOpDesc(2**64, 0, 0),
                lambda: hixl.NotifyDesc(b"x", "y"), lambda: hixl.GetTransferStatusArgs(2**32)):
        with pytest.raises(TypeError):
            bad()


def test_capability() -> None:
    assert hixl.get_capability(hixl.AUTO_CONNECT) == (hixl.SUCCESS, hixl.FEATURE_SUPPORTED)
    assert hixl.get_capability(hixl.FeatureType.CLIENT_SERVER_COMM) == (hixl.SUCCESS, hixl.FEATURE_SUPPORTED)
    with pytest.raises(TypeError):
        hixl.get_capability(0)  # type: ignore[arg-type]


def test_uninitialized_calls_fail() -> None:
    """hixl_py.cc: every call of an engine not initialized (or finalized) returns FAILED."""
    h = hixl.Hixl()
    mem, op = hixl.MemDesc(1, 1), [hixl.TransferOpDesc(1, 1, 1)]
    assert h.register_mem(mem, hixl.MEM_HOST) == (hixl.FAILED, 0)
    assert h.deregister_mem(1) == hixl.FAILED
    for call in (h.connect, h.disconnect, h.connect_async, h.disconnect_async):
        assert call("127.0.0.1:1") == hixl.FAILED
    assert h.get_async_connect_status("127.0.0.1:1") == (hixl.FAILED, hixl.NOT_CONNECT)
    assert h.get_all_async_connect_status() == (hixl.FAILED, {})
    assert h.transfer_sync("127.0.0.1:1", hixl.READ, op) == hixl.FAILED
    assert h.transfer_async("127.0.0.1:1", hixl.WRITE, op) == (hixl.FAILED, 0)
    assert h.get_transfer_status(1) == (hixl.FAILED, hixl.TransferStatus.FAILED)
    assert h.get_all_transfer_status() == (hixl.FAILED, [])
    assert h.send_notify("127.0.0.1:1", hixl.NotifyDesc("a", "b")) == hixl.FAILED
    assert h.get_notifies() == (hixl.FAILED, [])
    h.finalize()
    with pytest.raises(TypeError):
        h.transfer_sync("127.0.0.1:1", 0, op)  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [
    {"AutoConnect": "2"}, {"AutoConnect": ""}, {"AutoConnect": "yes"},
    {"RdmaTrafficClass": "3"}, {"RdmaTrafficClass": "256"}, {"adxl.RdmaTrafficClass": "x"},
    {"RdmaServiceLevel": "8"}, {"RdmaServiceLevel": "-1"},
    {"GlobalResourceConfig": "[]"}, {"GlobalResourceConfig": "{"},
    {"GlobalResourceConfig": '{"connect_pool.thread_num": 0}'},
    {"GlobalResourceConfig": '{"connect_pool.task_queue_capacity": 65536}'},
    {"GlobalResourceConfig": '{"comm_resource_config.listen_port": "70000"}'},
    {"GlobalResourceConfig": '{"comm_resource_config.qos": 8}'},
    {"GlobalResourceConfig": '{"fabric_memory": {"task_stream_num": 2}}'},
    {"GlobalResourceConfig": '{"fabric_memory.enable_aicpu_unfold": 1}'},
    {"GlobalResourceConfig": '{"local_comm_res_path": ""}'},
    {"GlobalResourceConfig": '{"local_comm_res_path": "/nonexistent/x.json"}'},
    {"LocalCommRes": "{not json"},
    {"EnableUseFabricMem": "1"}, {"EnableUseFabricMem": "0"}, {"EnableUseFabricMem": "2"},
    {"BufferPool": "4:8"}, {"adxl.BufferPool": ""},
    {"NoSuchOption": "1"},
])
def test_options_refused(options: dict[str, str]) -> None:
    with pytest.raises(Refused) as info:
        parse_options(options, env={})
    assert info.value.status == hixl.PARAM_INVALID


def test_options_accepted(tmp_path) -> None:  # noqa: ANN001
    res = tmp_path / "res.json"
    res.write_text('{"version": "1.3"}')
    parsed = parse_options({
        "AutoConnect": "1", "RdmaTrafficClass": "132", "adxl.RdmaServiceLevel": "4", "BufferPool": "0:0",
        "GlobalResourceConfig": f'{{"connect_pool.thread_num": "3", "connect_pool.task_queue_capacity": 7, '
                                f'"comm_resource_config.protocol_desc": ["roce"], "local_comm_res_path": "{res}"}}',
    }, env={})
    assert (parsed.auto_connect, parsed.rdma_traffic_class, parsed.rdma_service_level) == (True, 132, 4)
    assert (parsed.connect_threads, parsed.connect_queue) == (3, 7)
    assert parse_options({}, env={"HCCL_RDMA_TC": "8", "HCCL_RDMA_SL": "2"}).rdma_traffic_class == 8
    assert parse_options({"datadist.daemon": "/x.sock"}, env={}).daemon == "/x.sock"


def test_connect_pool() -> None:
    """connect_pool_executor.cc: a bounded queue (RESOURCE_EXHAUSTED when full), FAILED once shut down; a task's
    progress never overwrites the pending state of a later call on its remote."""
    release = threading.Event()

    def connect(remote: str, timeout: int) -> int:
        release.wait(30)
        return hixl.SUCCESS

    pool = _connect_pool.ConnectPool(1, 1, connect, lambda r, t: hixl.SUCCESS)
    try:
        assert pool.submit("a", 10, True) == hixl.SUCCESS
        _until(lambda: pool.status("a") == _connect_pool.CONNECTING)   # the one worker runs it, blocked
        assert pool.submit("a", 10, False) == hixl.SUCCESS               # queued
        assert pool.status("a") == _connect_pool.DISCONNECT_PENDING
        assert pool.submit("b", 10, True) == hixl.RESOURCE_EXHAUSTED     # the queue holds one
        release.set()
        _until(lambda: pool.status("a") == _connect_pool.NOT_CONNECT)   # CONNECTED did not overwrite the pending
    finally:
        release.set()
        pool.shutdown()
    assert pool.submit("a", 10, True) == hixl.FAILED


def test_connect_pool_statuses() -> None:
    done = threading.Event()
    pool = _connect_pool.ConnectPool(2, 8, lambda r, t: hixl.SUCCESS if r == "ok" else hixl.FAILED,
                                     lambda r, t: (done.set(), hixl.SUCCESS)[1])
    try:
        pool.submit("ok", 10, True)
        pool.submit("no", 10, True)
        _until(lambda: pool.statuses() == {"ok": _connect_pool.CONNECTED, "no": _connect_pool.CONNECT_FAILED})
        pool.submit("ok", 10, False)
        assert done.wait(30)
        _until(lambda: pool.status("ok") == _connect_pool.NOT_CONNECT)
        assert pool.statuses() == {"no": _connect_pool.CONNECT_FAILED}
    finally:
        pool.shutdown()


def _until(check) -> None:  # noqa: ANN001
    ev = threading.Event()
    for _ in range(3000):
        if check():
            return
        ev.wait(0.01)
    raise AssertionError("condition not reached in 30 s")


class FakeAttach:
    """What ``Requests`` uses of an ``AttachClient``: a submitted frame's reply as the test settles it."""

    def __init__(self) -> None:
        self.outcome: dict = {}            # request id -> (bytes, transport) or the LLMException it failed with
        self.withdrawn: set = set()

    def poll(self, rid: int, box: object, func: str) -> object:
        got = self.outcome.get(rid)
        if isinstance(got, LLMException):
            raise got
        return got

    def withdraw(self, rid: int) -> None:
        self.withdrawn.add(rid)


def _failure(code: LLMStatusCode) -> LLMException:
    return LLMException("fake", status_code=code)


def test_requests() -> None:
    """hixl_engine.cc GetTransferStatus: WAITING until done, then one final status, reported once and forgotten;
    the batch query in submission order, ``max_query_count`` results at most, ``skip_waiting``; a request past its
    deadline is TIMEOUT and withdrawn (its late reply dropped); a forgotten request is withdrawn."""
    reqs, attach = _requests.Requests(), FakeAttach()
    ids = [reqs.start(attach, "r", 100 + i, 10 + i, None, 60.0) for i in range(5)]   # type: ignore[arg-type]
    assert len(set(ids)) == 5 and 0 not in ids
    assert reqs.status(ids[0]) == (hixl.SUCCESS, _requests.WAITING)
    attach.outcome[10] = (4096, "tcp")
    attach.outcome[11] = _failure(LLMStatusCode.LLM_TIMEOUT)
    attach.outcome[12] = _failure(LLMStatusCode.LLM_FAILED)
    assert reqs.status(ids[0]) == (hixl.SUCCESS, _requests.COMPLETED)
    attach.outcome[10] = _failure(LLMStatusCode.LLM_FAILED)   # a second end changes nothing: it was reported
    assert reqs.status(ids[0]) == (hixl.PARAM_INVALID, _requests.FAILED_)   # reported, forgotten
    assert reqs.collect(0, False) == []
    assert reqs.collect(1, True) == [(ids[1], 101, _requests.TIMED_OUT)]
    assert reqs.collect(10, True) == [(ids[2], 102, _requests.FAILED_)]
    assert reqs.collect(10, False) == [(ids[3], 103, _requests.WAITING), (ids[4], 104, _requests.WAITING)]
    attach.outcome[14] = (4096, "tcp")
    assert reqs.collect(1, True) == [(ids[4], 104, _requests.COMPLETED)]
    reqs.forget("r")
    assert attach.withdrawn == {13} and reqs.collect(10, False) == []
    late = reqs.start(attach, "r", 7, 20, None, 0.0)   # type: ignore[arg-type]   # its deadline passed at once
    assert reqs.status(late) == (hixl.SUCCESS, _requests.TIMED_OUT) and 20 in attach.withdrawn
