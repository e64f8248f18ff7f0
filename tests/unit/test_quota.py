"""The per-uid quota book: one uid at its limit never limits another; every charge comes back once."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.guard.quota import QuotaBook, QuotaLimits
from datadistd.ops.config import load_config


def test_a_uid_at_its_quota_does_not_limit_another():
    book = QuotaBook(QuotaLimits(imported_bytes_per_uid=100, imported_mappings_per_uid=2))
    book.take(1, imported_bytes=100, imported_mappings=1)
    with pytest.raises(DataDistError) as info:
        book.take(1, imported_bytes=1, imported_mappings=1)
    assert info.value.code == StatusCode.LLM_OUT_OF_MEMORY and "imported_bytes_per_uid = 100" in info.value.message
    assert book.used(1) == {"imported_bytes": 100, "imported_mappings": 1}   # a refusal books nothing
    book.take(2, imported_bytes=100, imported_mappings=2)


def test_zero_is_no_limit_and_config_reaches_the_book():
    book = QuotaBook(QuotaLimits(engines_per_uid=0))
    for _ in range(1000):
        book.take(5, engines=1)
    cfg = load_config(env={"DATADISTD_QUOTA_POOLS_PER_UID": "3"})
    assert cfg.quota.limits().pools_per_uid == 3 and cfg.quota.limits().engines_per_uid == 64


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.booleans()), max_size=60))
def test_charges_come_back_exactly(ops):
    book = QuotaBook(QuotaLimits(imported_bytes_per_uid=100))
    held = []
    for uid, amount, release in ops:
        try:
            held.append(book.take(uid, imported_bytes=amount))
        except DataDistError:
            assert book.used(uid).get("imported_bytes", 0) + amount > 100
        if release and held:
            charge = held.pop(0)
            charge.release()
            charge.release()          # idempotent
    for charge in held:
        charge.release()
    assert all(book.used(uid) == {} for uid in range(4))


def test_link_usage_caps_calls_writes_pinned_bytes_and_clamps_waits():
    from datadistd.guard.quota import LinkLimits, LinkUsage

    limits = LinkLimits(calls_in_flight=2, open_writes=10, pinned_bytes=100, max_wait_ms=1000, calls_queued=1)

    async def calls() -> None:
        usage = LinkUsage()
        await usage.enter_call(limits, time.monotonic() + 5)
        await usage.enter_call(limits, time.monotonic() + 5)
        third = asyncio.ensure_future(usage.enter_call(limits, time.monotonic() + 5))   # waits for a turn
        await asyncio.sleep(0)
        assert not third.done() and usage.waiting == 1
        with pytest.raises(DataDistError) as info:                  # the queue is full
            await usage.enter_call(limits, time.monotonic() + 5)
        assert info.value.code == StatusCode.LLM_LINK_BUSY
        usage.exit_call()                                           # its turn goes to the waiting one
        await asyncio.wait_for(third, 5)
        assert usage.calls == 2 and usage.waiting == 0
        with pytest.raises(DataDistError) as info:                  # no turn before the deadline
            await usage.enter_call(limits, time.monotonic() + 0.05)
        assert info.value.code == StatusCode.LLM_TIMEOUT and usage.waiting == 0 and usage.calls == 2
        usage.exit_call()
        usage.exit_call()
        assert usage.calls == 0

    asyncio.run(calls())
    usage = LinkUsage()
    usage.open_writes(limits, 5, 60)
    for count, nbytes, key in ((6, 1, "link_open_writes"), (1, 41, "link_pinned_bytes")):
        with pytest.raises(DataDistError) as info:
            usage.open_writes(limits, count, nbytes)
        assert key in info.value.message
    assert (usage.writes, usage.pinned) == (5, 60)        # a refusal books nothing
    usage.close_writes(5, 60)
    assert limits.clamp(2**32 - 1) == 1000 and limits.clamp(10) == 10 and LinkLimits(max_wait_ms=0).clamp(7) == 7
