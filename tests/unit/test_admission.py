"""Admission of connections before they authenticate: caps per source and in all, eviction of the oldest,
the pre-auth deadline, the hard cap, and a log that a flood cannot fill."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datadistd.guard.admission import Admission, AdmissionLimits, RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Conn:
    """A connection as a listener sees it: closed by admission through its callback."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.closed = False

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def admit(adm: Admission, source: str):  # noqa: ANN201
    conn = Conn(source)
    return conn, adm.admit(source, conn.close)


def test_limits_are_checked() -> None:
    for bad in (dict(preauth_seconds=0), dict(per_source=0), dict(per_source=9, preauth_total=8),
                dict(preauth_total=2000, max_connections=1024)):
        with pytest.raises(ValueError):
            AdmissionLimits(**bad)


def test_a_source_over_its_cap_loses_its_oldest_connection() -> None:
    adm = Admission("t", AdmissionLimits(10, per_source=3, preauth_total=10, max_connections=20), clock=Clock())
    a = [admit(adm, "10.0.0.1") for _ in range(3)]
    other = admit(adm, "10.0.0.2")
    newest = admit(adm, "10.0.0.1")
    assert newest[1] is not None and a[0][0].closed and not any(c.closed for c, _ in a[1:])
    assert not other[0].closed
    assert adm.stats()["preauth"] == 4 and adm.evicted == 1


def test_over_the_total_the_heaviest_source_pays() -> None:
    adm = Admission("t", AdmissionLimits(10, per_source=4, preauth_total=6, max_connections=20), clock=Clock())
    strangers = [admit(adm, "10.0.0.9") for _ in range(4)]
    few = [admit(adm, f"10.0.1.{i}") for i in range(2)]
    legit = admit(adm, "10.0.0.1")                     # the listener is full: the stranger with most pays
    assert legit[1] is not None and strangers[0][0].closed
    assert not any(c.closed for c, _ in few) and not legit[0].closed


def test_authenticated_connections_leave_the_pre_auth_books_and_the_deadline() -> None:
    clock = Clock()
    adm = Admission("t", AdmissionLimits(5, per_source=2, preauth_total=4, max_connections=6), clock=clock)
    conn, ticket = admit(adm, "10.0.0.1")
    adm.authenticate(ticket)
    for _ in range(3):
        admit(adm, "10.0.0.2")                         # pre-auth ones come and go; the proven one stays
    clock.now += 60
    assert adm.expire() == 2 and not conn.closed and ticket.authenticated
    assert adm.stats() == {"preauth": 0, "authenticated": 1, "sources": 0, "evicted": 1, "expired": 2,
                           "refused": 0}
    adm.release(ticket)
    adm.release(ticket)                                # idempotent
    assert adm.stats()["authenticated"] == 0


def test_silent_connections_expire_oldest_first() -> None:
    clock = Clock()
    adm = Admission("t", AdmissionLimits(10, per_source=8, preauth_total=8, max_connections=8), clock=clock)
    assert adm.next_deadline() is None                 # nothing due: the accept loop sleeps until a newcomer
    early = admit(adm, "a")
    clock.now += 6
    late = admit(adm, "b")
    assert adm.next_deadline() == early[1].deadline    # the oldest is the first due
    clock.now += 5
    assert adm.expire() == 1 and early[0].closed and not late[0].closed
    assert adm.next_deadline() == late[1].deadline
    clock.now += 5
    assert adm.expire() == 1 and late[0].closed
    assert adm.next_deadline() is None
    adm.release(late[1])                               # the listener notices the close: nothing more to do
    assert adm.stats()["preauth"] == 0


def test_a_listener_own_timeout_counts_as_expired() -> None:
    adm = Admission("t", AdmissionLimits(10, per_source=2, preauth_total=2, max_connections=3), clock=Clock())
    conn, ticket = admit(adm, "a")
    adm.timed_out(ticket)
    adm.timed_out(ticket)
    assert adm.stats()["expired"] == 1 and adm.stats()["preauth"] == 0 and not conn.closed


def test_the_hard_cap_refuses() -> None:
    adm = Admission("t", AdmissionLimits(10, per_source=2, preauth_total=2, max_connections=3), clock=Clock())
    tickets = [admit(adm, f"s{i}")[1] for i in range(2)]
    for t in tickets:
        adm.authenticate(t)
    assert admit(adm, "x")[1] is not None
    conn, refused = admit(adm, "y")
    assert refused is None and not conn.closed and adm.refused == 1   # the listener closes it


def test_an_evicted_ticket_cannot_authenticate_afterwards() -> None:
    adm = Admission("t", AdmissionLimits(10, per_source=1, preauth_total=4, max_connections=4), clock=Clock())
    first = admit(adm, "a")
    admit(adm, "a")
    adm.authenticate(first[1])
    assert first[0].closed and not first[1].authenticated and adm.stats()["authenticated"] == 0


def test_refusals_are_logged_at_a_bounded_rate(caplog) -> None:  # noqa: ANN001
    clock = Clock()
    log = RefusalLog(logging.getLogger("test.refusals"), "listener x", every=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for i in range(10_000):
            log(f"stranger {i}")
            if i % 1000 == 999:
                clock.now += 1
        clock.now += 10
        log("the last one")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "listener x: stranger 0"
    assert len(lines) == 2 and "10000 refusals" in lines[1] and "the last one" in lines[1]
    assert log.total == 10_001


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "auth", "release", "tick", "expire"]),
                          st.integers(0, 4)), max_size=80))
def test_the_books_hold_under_any_sequence(ops: list[tuple[str, int]]) -> None:
    clock = Clock()
    lim = AdmissionLimits(5, per_source=2, preauth_total=5, max_connections=7)
    adm = Admission("t", lim, clock=clock)
    live: list[tuple[Conn, object]] = []
    for op, n in ops:
        if op == "admit":
            conn, ticket = admit(adm, f"s{n}")
            if ticket is not None:
                live.append((conn, ticket))
        elif op == "tick":
            clock.now += n
        elif op == "expire":
            adm.expire()
        elif live:
            conn, ticket = live[n % len(live)]
            if op == "auth":
                adm.authenticate(ticket)  # type: ignore[arg-type]
            else:
                adm.release(ticket)  # type: ignore[arg-type]
                live.remove((conn, ticket))
        stats = adm.stats()
        open_preauth = [t for c, t in live if not c.closed and not t.authenticated]  # type: ignore[attr-defined]
        open_auth = [t for c, t in live if t.authenticated and not t.closed]  # type: ignore[attr-defined]
        assert stats["preauth"] == len(open_preauth) <= lim.preauth_total
        assert stats["authenticated"] == len(open_auth)
        assert stats["preauth"] + stats["authenticated"] <= lim.max_connections
        per_source: dict[str, int] = {}
        for t in open_preauth:
            per_source[t.source] = per_source.get(t.source, 0) + 1  # type: ignore[attr-defined]
        # a source that proved the secret lately may hold more (issue 37, item 1), never more than the total
        assert all(v <= (min(lim.proven_per_source, lim.preauth_total) if adm.proven(s) else lim.per_source)
                   for s, v in per_source.items())
        if op == "expire":   # nothing pre-auth outlives its deadline past a sweep
            assert all(t.deadline > clock.now for t in open_preauth)  # type: ignore[attr-defined]


def test_sources_are_counted_per_ipv6_64() -> None:
    from datadistd.guard.admission import source_key

    assert source_key("10.1.2.3") == "10.1.2.3"
    assert source_key("2001:db8:1:2:aaaa::1") == source_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key("::ffff:10.1.2.3") == "10.1.2.3"
    adm = Admission("t", AdmissionLimits(per_source=2, preauth_total=64), clock=Clock())
    conns = [admit(adm, f"2001:db8::{i:x}")[0] for i in range(10)]    # ten addresses of one /64: one source
    assert sum(c.closed for c in conns) == 8


def test_churning_sources_are_evicted_before_a_peer_with_one_connection() -> None:
    """Issue 27, attack 9: 100 sources churning connections; a peer's single pre-auth connection stays."""
    clock = Clock()
    adm = Admission("t", AdmissionLimits(per_source=8, preauth_total=64), clock=clock)
    peer, ticket = admit(adm, "10.0.0.1")
    for i in range(4000):
        admit(adm, f"10.9.{i % 100}.1")
        clock.now += 0.00025                       # ~4,000 connections/s
    assert not peer.closed and ticket is not None
    adm.authenticate(ticket)


def test_challenges_are_limited_per_connection_and_per_source() -> None:
    clock = Clock()
    adm = Admission("t", AdmissionLimits(challenges_per_connection=4, challenges_per_second=10), clock=clock)
    _, a = admit(adm, "10.0.0.1")
    assert a is not None
    assert [adm.allow_challenge(a) for _ in range(6)] == [True] * 4 + [False] * 2
    tickets = [admit(adm, "10.0.0.2")[1] for _ in range(8)]
    granted = sum(adm.allow_challenge(t) for t in tickets for _ in range(4) if t is not None)
    assert granted == 8 + 20     # each connection's first (outside the bucket), then the source's burst of 20
    _, b = admit(adm, "10.0.0.2")
    assert b is not None and adm.allow_challenge(b)  # a new connection's first, with the bucket empty ...
    assert not adm.allow_challenge(b)                # ... but not its second
    clock.now += 1.0
    assert adm.allow_challenge(b)                    # refilled
    _, c = admit(adm, "10.0.0.3")
    assert c is not None and adm.allow_challenge(c)  # another source is not limited by these
    adm.authenticate(a)
    assert adm.allow_challenge(a)                    # an authenticated connection has no per-connection cap


def test_a_proven_source_gets_a_start_up_budget_and_strangers_keep_theirs() -> None:
    """Issue 37, item 1: an address that proved the secret lately (one of its connections authenticated) may open
    the connections and ask the challenges of a node's start-up (16 links at once, each with 4 data connections;
    a link loop at ~20/s); a stranger stays at 8 connections and 20 challenges (10/s)."""
    clock = Clock()
    lim = AdmissionLimits()
    adm = Admission("t", lim, clock=clock)
    first = [admit(adm, "10.0.0.1") for _ in range(16)]        # a first burst: the stranger caps still hold
    assert sum(c.closed for c, _ in first) == 16 - lim.per_source and not adm.proven("10.0.0.1")
    adm.authenticate(first[-1][1])                             # ... until one of them proves the secret
    assert adm.proven("10.0.0.1")
    burst = [admit(adm, "10.0.0.1") for _ in range(lim.proven_per_source - lim.per_source + 1)]
    assert not any(c.closed for c, _ in burst)                 # 64 pre-auth connections, none evicted
    held = [t for c, t in first + burst if not c.closed and t is not None and not t.authenticated]
    assert len(held) == lim.proven_per_source
    granted = sum(adm.allow_challenge(t) for t in held for _ in range(4))
    assert granted == 4 * len(held)       # 256: each one's first outside the proven bucket, 192 from its 256 ...
    linked = first[-1][1]                  # (authenticated: every challenge it asks comes from the bucket)
    assert sum(adm.allow_challenge(linked) for _ in range(100)) == 2 * lim.proven_challenges_per_second - 192
    extra = admit(adm, "10.0.0.1")[1]
    assert adm.allow_challenge(extra) and not adm.allow_challenge(extra)  # ... and past a first no more at once
    strangers = [admit(adm, "10.0.0.9") for _ in range(16)]     # the listener is full: a stranger is evicted first,
    assert sum(c.closed for c, _ in strangers) == 16 - 1        # its own oldest, down to one each time
    # the proven source lost two more: one to its own 65th, one to the stranger's first (it then held them all)
    assert sum(c.closed for c, _ in first + burst) == 16 - lim.per_source + 2
    late = [admit(adm, "10.0.0.8")[1] for _ in range(40)]
    stranger_granted = sum(adm.allow_challenge(t) for t in late for _ in range(2))
    assert stranger_granted == 40 + 2 * lim.challenges_per_second   # firsts, then 20: a stranger's bucket as before
    clock.now += lim.proven_seconds + 1                        # proven only lately: then a stranger again
    assert not adm.proven("10.0.0.1")
