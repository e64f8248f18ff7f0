"""The ``local`` transport (same daemon: plain memory copies) and the ``hccl`` placeholder."""

from __future__ import annotations

import importlib
import itertools
import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.memory.base import Segment
from datadistd.transport import get_transport
from datadistd.transport.local import LocalTransport
from tests.fakes import ArrayHandle  # noqa: E402


class CopyHandle(ArrayHandle):
    """Memory without a mapping: only ``read_into``/``write_from``."""

    def view(self) -> memoryview | None:
        return None


def sockets_open() -> int:
    """Socket file descriptors of this process (proof that a copy opened none)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def deadline(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


@pytest.fixture
def local() -> LocalTransport:
    t = get_transport("local", host="127.0.0.1", port=0, chunk_size=1 << 20, connect_timeout=1.0)
    assert isinstance(t, LocalTransport)
    t.start()
    yield t
    t.stop()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_copy_random_segment_lists_byte_exact(data) -> None:  # noqa: ANN001
    t = LocalTransport()
    total = data.draw(st.integers(0, 5000))
    src_handles = [ArrayHandle(total + 600, seed=1), CopyHandle(total + 600, seed=2)]
    dst_handles = [ArrayHandle(total + 600), CopyHandle(total + 600)]

    def cut(handles: list[ArrayHandle], what: str) -> list[Segment]:
        points = sorted(data.draw(st.lists(st.integers(0, total), max_size=6), label=f"{what} cuts"))
        bounds = [0, *points, total]
        cursor = {id(h): 0 for h in handles}
        segments = []
        for a, b in itertools.pairwise(bounds):  # zero-length pieces included on purpose
            h = handles[data.draw(st.integers(0, 1), label=f"{what} handle")]
            gap = data.draw(st.integers(0, 64), label=f"{what} gap")
            segments.append(Segment(h, cursor[id(h)] + gap, b - a))
            cursor[id(h)] += gap + b - a
        return segments

    src, dst = cut(src_handles, "src"), cut(dst_handles, "dst")
    stream = np.concatenate([s.handle.arr[s.offset:s.offset + s.length] for s in src])  # type: ignore[attr-defined]
    oracle = [h.arr.copy() for h in dst_handles]
    pos = 0
    for seg in dst:
        oracle[dst_handles.index(seg.handle)][seg.offset:seg.offset + seg.length] = stream[pos:pos + seg.length]
        pos += seg.length
    assert t.copy(dst, src, deadline()) == total
    for h, want in zip(dst_handles, oracle, strict=True):
        np.testing.assert_array_equal(h.arr, want)
    assert t.stats()["bytes_copied"] == total


def test_local_copy_moves_no_bytes_over_a_socket(local: LocalTransport) -> None:
    n = 8 << 20
    src, dst = ArrayHandle(n, seed=3), ArrayHandle(n)
    before = sockets_open()
    assert local.copy([Segment(dst, 0, n)], [Segment(src, 0, n)], deadline()) == n
    assert sockets_open() == before
    np.testing.assert_array_equal(dst.arr, src.arr)
    stats = local.stats()
    assert stats["bytes_copied"] == n and stats["copies"] == 1
    assert stats["bytes_sent"] == 0 and stats["bytes_received"] == 0 and stats["connections"] == 0


def test_local_copy_checks_before_moving_anything(local: LocalTransport) -> None:
    src, dst = ArrayHandle(100, seed=4), ArrayHandle(100)
    with pytest.raises(DataDistError) as err:
        local.copy([Segment(dst, 0, 50)], [Segment(src, 0, 60)], deadline())
    assert err.value.code == S.LLM_PARAM_INVALID
    with pytest.raises(DataDistError) as err:
        local.copy([Segment(dst, 90, 20)], [Segment(src, 0, 20)], deadline())
    assert err.value.code == S.LLM_PARAM_INVALID
    with pytest.raises(DataDistError) as err:
        local.copy([Segment(dst, 0, 10)], [Segment(src, 0, 10)], time.monotonic() - 0.001)
    assert err.value.code == S.LLM_TIMEOUT
    assert not dst.arr.any() and local.stats()["bytes_copied"] == 0


def test_local_transport_has_no_wire(local: LocalTransport) -> None:
    assert local.name == "local" and local.endpoint == "local://"
    local.allow(b"t" * 16)
    assert local.channel(b"t" * 16) is None
    local.revoke(b"t" * 16)
    for call in (lambda: local.connect("tcp://127.0.0.1:1", b"t" * 16, 1, deadline()),
                 lambda: local.expect([Segment(ArrayHandle(4), 0, 4)])):
        with pytest.raises(DataDistError) as err:
            call()
        assert err.value.code == S.LLM_FEATURE_NOT_ENABLED and "local" in err.value.message


def test_hccl_imports_but_refuses_honestly() -> None:
    module = importlib.import_module("datadistd.transport.hccl")  # importing never fails
    with pytest.raises(DataDistError) as err:
        get_transport("hccl", host="127.0.0.1", port=0)
    assert err.value.code == S.LLM_FEATURE_NOT_ENABLED
    if module._find_bindings() is None:
        assert err.value.message == ("hccl transport needs Ascend CANN (hccl) which is not installed on this "
                                     "machine; it cannot be verified here")


def test_unknown_transport_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hccl, local, tcp"):
        get_transport("rdma")
