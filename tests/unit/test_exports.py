"""The worker's export keys (``llm_datadist._exports``, issue 45 finding 11) against a fake runtime: one key per
range whatever the number of users, closed once when the last goes, a pid allowed once; a close that fails is
logged once and never raised."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import pytest

from datadist.status import LLMStatusCode as S
from datadist_ascend import AscendError
from llm_datadist._exports import ExportKeys


class FakeAcl:
    def __init__(self, fail_close: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_close = fail_close

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        yield

    def ipc_export(self, device: int, ptr: int, size: int) -> str:
        self.calls.append(("export", ptr))
        return f"key-{ptr:x}"

    def ipc_allow(self, device: int, key: str, pids: list[int]) -> None:
        self.calls.append(("allow", key, *pids))

    def ipc_close(self, device: int, key: str) -> None:
        self.calls.append(("close", key))
        if self.fail_close:
            raise AscendError("aclrtIpcMemClose", 107000, S.LLM_FAILED)


def test_a_range_has_one_key_closed_when_its_last_user_goes() -> None:
    acl, keys = FakeAcl(), ExportKeys()
    rng = (0, 0x1000, 64)
    assert keys.acquire(acl, rng, 7) == keys.acquire(acl, rng, 7) == "key-1000"
    keys.acquire(acl, rng, 8)   # another daemon: allowed too, same key
    assert acl.calls == [("export", 0x1000), ("allow", "key-1000", 7), ("allow", "key-1000", 8)]
    keys.release([rng], acl)
    keys.release([rng], acl)
    assert keys.open_keys() == 1 and ("close", "key-1000") not in acl.calls
    keys.release([rng], acl)
    keys.release([rng], acl)   # more releases than users: nothing more
    assert keys.open_keys() == 0 and acl.calls.count(("close", "key-1000")) == 1


def test_a_close_that_fails_is_logged_once_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    acl, keys = FakeAcl(fail_close=True), ExportKeys()
    ranges = [(0, 0x1000 * i, 64) for i in range(1, 4)]
    for rng in ranges:
        keys.acquire(acl, rng, 7)
    with caplog.at_level(logging.WARNING, logger="llm_datadist._exports"):
        keys.release(ranges, acl)
    assert keys.open_keys() == 0 and sum(c[0] == "close" for c in acl.calls) == 3
    assert len([r for r in caplog.records if "aclrtIpcMemClose" in r.getMessage()]) == 1
