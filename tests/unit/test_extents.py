"""HIXL's extents (``engine.extents``): the one rule that resolves an extent against registrations by address
(``Regions.locate``: wholly inside one, or refused naming it) held to a brute-force oracle; the request's bounds
(``parse_extents``, ``pairs_array``: what a worker or a hostile peer reaches); the notify queue's bounds."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datadist import hixl
from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.engine.extents import MAX_EXTENTS, Regions, pairs_array, parse_extents, remote_pairs
from datadistd.engine.notifies import Notifies

U64 = np.dtype("<u8")
REGIONS = st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(1, 4096)), max_size=8)
EXTENTS = st.lists(st.tuples(st.integers(1, (1 << 20) + 8192), st.integers(1, 5000)), min_size=1, max_size=30)


def _oracle(regions: list[tuple[int, int]], addr: int, length: int) -> set[int]:
    return {k for k, (base, size) in enumerate(regions) if base <= addr and addr + length <= base + size}


@settings(max_examples=300, deadline=None)
@given(REGIONS, EXTENTS)
def test_locate_is_the_brute_force_rule(regions: list, extents: list) -> None:
    """Each extent lands in a region that holds it whole (any of them where regions overlap), at its offset into
    it; when one extent is held by none, the whole request is refused naming the first such extent."""
    index = Regions((base, size, k) for k, (base, size) in enumerate(regions))
    addrs = np.array([a for a, _ in extents], dtype=U64)
    lens = np.array([n for _, n in extents], dtype=U64)
    holders = [_oracle(regions, a, n) for a, n in extents]
    for asked in ((addrs, lens), (addrs.tolist(), lens.tolist())):   # by arrays, and a few as ints
        if not all(holders):
            first = next(i for i, h in enumerate(holders) if not h)
            with pytest.raises(DataDistError) as info:
                index.locate(*asked, "cluster 5")
            assert info.value.code == S.LLM_PARAM_INVALID
            assert info.value.message.startswith(f"extent {first}: ") and "cluster 5" in info.value.message
            continue
        which, offsets = index.locate(*asked, "cluster 5")
        for i, (a, _) in enumerate(extents):
            k = index.items[int(which[i])]
            assert k in holders[i]
            assert int(offsets[i]) == a - regions[k][0]


def _raw(*rows: tuple[int, int, int]) -> bytes:
    return b"".join(struct.pack("<QQQ", *r) for r in rows)


@pytest.mark.parametrize("raw,what", [
    (b"", "no extent"),
    (b"\0" * 23, "not whole extents"),
    (_raw((0, 8, 8)), "a null local address"),
    (_raw((8, 0, 8)), "a null remote address"),
    (_raw((8, 8, 0)), "an empty extent"),
    (_raw((2**64 - 8, 8, 16)), "a local extent past the address space"),
    (_raw((8, 2**64 - 1, 2)), "a remote extent past the address space"),
    (_raw(*[(8, 8, 2**62)] * 3), "more than 2^63 bytes"),
    (_raw((8, 8, 8)) * (MAX_EXTENTS + 1), "too many extents"),
    (_raw(*[(8, 8, 8)] * 20, (8, 0, 8)), "a null remote address among many"),
    (_raw(*[(8, 8, 8)] * 20, (2**64 - 8, 8, 16)), "past the address space among many"),
])
def test_a_request_out_of_bounds_is_refused(raw: bytes, what: str) -> None:
    with pytest.raises(DataDistError) as info:
        parse_extents(raw)
    assert info.value.code == S.LLM_PARAM_INVALID, what


def test_the_owner_checks_a_peers_pairs_as_the_requester_does() -> None:
    ext = parse_extents(_raw((16, 4096, 100), (32, 8192, 7)))
    addrs, lens = pairs_array(remote_pairs(ext))
    assert list(addrs) == [4096, 8192] and list(lens) == [100, 7]
    for pairs in ((), (4096,), (4096, 0), (0, 8), (2**64 - 1, 2), (1,) * (2 * MAX_EXTENTS + 2),
                  (8, 8) * 20 + (0, 8), (8, 8) * 20 + (8, 0)):
        with pytest.raises(DataDistError) as info:
            pairs_array(pairs)
        assert info.value.code == S.LLM_PARAM_INVALID, pairs


def test_notifies_keep_order_and_hixls_bounds() -> None:
    q = Notifies(most=3)
    for i in range(3):
        q.push(b"n%d" % i, b"m", sender=1)
    with pytest.raises(DataDistError) as info:
        q.push(b"x", b"", sender=1)
    assert info.value.code == S.LLM_OUT_OF_MEMORY and hixl.hixl_status(info.value.code) == hixl.RESOURCE_EXHAUSTED
    assert q.take() == [(b"n0", b"m"), (b"n1", b"m"), (b"n2", b"m")] and q.take() == []
    for name, msg in ((b"x" * 1025, b""), (b"", b"y" * 1025)):
        with pytest.raises(DataDistError) as info:
            q.push(name, msg, sender=1)
        assert info.value.code == S.LLM_PARAM_INVALID
    q.push(b"x" * 1024, b"y" * 1024, sender=1)   # at the bounds: taken
    assert len(q) == 1


@pytest.mark.parametrize("text,canonical", [
    ("127.0.0.1", "127.0.0.1"), ("127.0.0.1:16000", "127.0.0.1:16000"), ("[::1]", "[::1]"),
    ("[::1]:16000", "[::1]:16000"), ("[0:0::1]:7", "[::1]:7"), ("127.0.0.1:0", "127.0.0.1"),
    ("[::ffff:1.2.3.4]:9", "[::ffff:102:304]:9")])
def test_engine_strings(text: str, canonical: str) -> None:
    engine = hixl.parse_engine(text)
    assert engine.canonical == canonical
    assert hixl.engine_cluster_id(engine) == hixl.engine_cluster_id(hixl.parse_engine(canonical))
    assert 0 < hixl.engine_cluster_id(engine) < 2**63


@pytest.mark.parametrize("text", ["", " 127.0.0.1", "host:1", "127.0.0.1:", "127.0.0.1:65536",
                                  "::1", "[::1", "[::1]x", "[::1]:", "1.2.3.4:5:6", "127.0.0.1:x"])
def test_bad_engine_strings(text: str) -> None:
    with pytest.raises(ValueError):
        hixl.parse_engine(text)


def test_every_llm_code_maps_to_a_hixl_status() -> None:
    codes = {hixl.SUCCESS, hixl.PARAM_INVALID, hixl.TIMEOUT, hixl.NOT_CONNECTED, hixl.ALREADY_CONNECTED,
             hixl.UNSUPPORTED, hixl.FAILED, hixl.RESOURCE_EXHAUSTED}
    for code in S:
        assert hixl.hixl_status(code) in codes
    assert hixl.hixl_status(S.LLM_NOT_YET_LINK) == hixl.NOT_CONNECTED
    assert hixl.hixl_status(S.LLM_TIMEOUT) == hixl.TIMEOUT
    assert hixl.hixl_status(12345) == hixl.FAILED
