"""``tests.workerproc``: the pipe-driven worker process shared by the tests and the bench.

The worker imports this very module and runs the small operations below.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from datadist.status import LLMStatusCode
from tests.workerproc import WorkerError, WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests.unit.test_workerproc"


# ---- operations run inside the worker ---------------------------------------------------------------

def put(state: dict, key: str, value: object) -> None:
    state[key] = value


def get(state: dict, key: str) -> object:
    return state[key]


def getenv(state: dict, name: str) -> str | None:
    return os.environ.get(name)


class _CodedError(RuntimeError):
    def __init__(self, message: str, status_code: LLMStatusCode) -> None:
        super().__init__(message)
        self.status_code = status_code


def fail(state: dict, coded: bool) -> None:
    if coded:
        raise _CodedError("no such cache", LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
    raise ZeroDivisionError("plain failure")


def nap(state: dict, seconds: float) -> str:
    time.sleep(seconds)
    return "awake"


def leave_mark(state: dict) -> None:
    Path(state["mark"]).write_text("closed")


# ---- tests --------------------------------------------------------------------------------------------

@pytest.fixture
def worker():
    w = WorkerProcess(HERE, {"WORKERPROC_TEST": "1"}, path=str(ROOT), timeout=30, on_exit="leave_mark")
    yield w
    w.close()


def test_state_is_kept_across_calls_and_send_result_split_a_call(worker: WorkerProcess) -> None:
    worker.call("put", "k", [1, 2, 3])
    assert worker.call("get", "k") == [1, 2, 3]
    worker.send("getenv", "WORKERPROC_TEST")        # the worker's env has what it was given
    assert worker.result() == "1"
    worker.send("nap", 0.01)
    assert worker.result(timeout=30) == "awake"


def test_worker_exceptions_arrive_with_type_message_status_and_traceback(worker: WorkerProcess) -> None:
    with pytest.raises(WorkerError) as info:
        worker.call("fail", True)
    err = info.value
    assert (err.kind, err.message, err.status_code) == ("_CodedError", "no such cache",
                                                        int(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST))
    assert "in fail" in err.tb and str(err) == "_CodedError: no such cache"
    with pytest.raises(WorkerError) as info:
        worker.call("fail", False)
    assert info.value.kind == "ZeroDivisionError" and info.value.status_code is None
    assert worker.call("nap", 0) == "awake"          # the worker goes on serving


def test_a_slow_operation_times_out_naming_it(worker: WorkerProcess) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="worker op nap did not answer in 0.2s"):
        worker.call("nap", 5, timeout=0.2)
    assert time.monotonic() - t0 < 5
    worker.send("nap", 5)                          # send / result name the operation too
    with pytest.raises(TimeoutError, match="worker op nap did not answer in 0.1s"):
        worker.result(timeout=0.1)
    t0 = time.monotonic()
    worker.close(timeout=0.5)                      # busy: asked, then killed within the bound
    assert not worker.proc.is_alive() and time.monotonic() - t0 < 5


def test_close_runs_on_exit_and_a_killed_worker_fails_at_once(worker: WorkerProcess, tmp_path) -> None:
    mark = tmp_path / "mark"
    worker.call("put", "mark", str(mark))
    worker.close()
    assert mark.read_text() == "closed" and not worker.proc.is_alive()

    doomed = WorkerProcess(HERE, path=str(ROOT), timeout=30)
    try:
        assert doomed.call("nap", 0) == "awake"
        doomed.kill()
        t0 = time.monotonic()
        with pytest.raises((EOFError, BrokenPipeError, OSError)):
            doomed.call("nap", 0)
        assert time.monotonic() - t0 < 5   # the pipe's end is seen, not the 30 s timeout
    finally:
        doomed.close()
