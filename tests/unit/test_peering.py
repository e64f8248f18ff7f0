"""The handshake's freshness: challenges the serving engine issued, each good once, within its TTL."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from datadistd.links.wire.peering import CHALLENGE_BYTES, ChallengeStore, answer_mac, make_offer, offer_mac


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_challenge_is_redeemed_once() -> None:
    store = ChallengeStore(ttl=30, cap=8, clock=Clock())
    c = store.issue()
    assert len(c) == CHALLENGE_BYTES
    assert store.redeem(c)
    assert not store.redeem(c)            # a replay
    assert not store.redeem(b"")
    assert not store.redeem(bytes(32))   # never issued


def test_challenges_expire() -> None:
    clock = Clock()
    store = ChallengeStore(ttl=30, cap=8, clock=clock)
    c = store.issue()
    clock.now += 30.0
    assert not store.redeem(c)
    fresh = store.issue()
    clock.now += 29.9
    assert store.redeem(fresh)


def test_expired_challenges_are_forgotten_and_the_cap_drops_the_oldest() -> None:
    clock = Clock()
    store = ChallengeStore(ttl=30, cap=4, clock=clock)
    first = [store.issue() for _ in range(4)]
    late = store.issue()                   # over the cap: the oldest goes
    assert len(store) == 4 and not store.redeem(first[0]) and store.redeem(first[1]) and store.redeem(late)
    clock.now += 31
    store.issue()                          # expired ones leave as new ones come
    assert len(store) == 1


class Conn:
    """A connection that asked (``peering.Asker``: the front passes its admission ticket)."""

    def __init__(self) -> None:
        self.closed = False


def test_a_live_connections_challenge_outlives_any_flood_of_other_connections() -> None:
    """The honest peer's challenge, on its live connection, against a flood of the most admission lets one address
    hold at once (64 pre-auth connections x 4 challenges) and then 2,000 connections that asked 4 each and went
    (before, the store counted per address: 16 more challenges from the honest peer's own address evicted it). The
    store stays within its cap throughout."""
    store = ChallengeStore(clock=Clock())
    honest = Conn()
    mine = store.issue(honest)
    held = [Conn() for _ in range(64)]
    for conn in held:
        for _ in range(4):
            store.issue(conn)
    for _ in range(2000):
        gone = Conn()
        for _ in range(4):
            store.issue(gone)
        gone.closed = True
        assert len(store) <= store.cap
    assert store.redeem(mine)


def test_when_full_the_challenges_of_closed_connections_go_first_then_the_oldest() -> None:
    store = ChallengeStore(ttl=30, cap=4, clock=Clock())
    live, gone = Conn(), Conn()
    a = store.issue(live)
    b, c = store.issue(gone), store.issue(gone)
    d = store.issue(live)
    gone.closed = True
    e = store.issue(Conn())                # full: both of the closed connection's go, the live ones stay
    assert len(store) == 3 and not store.redeem(b) and not store.redeem(c)
    f, g = store.issue(None), store.issue(None)   # full again, nothing closed: the oldest goes
    assert not store.redeem(a) and all(store.redeem(x) for x in (d, e, f, g))


def test_one_connection_holds_at_most_its_share_its_own_oldest_going_first() -> None:
    store = ChallengeStore(ttl=30, cap=64, per_asker=4, clock=Clock())
    conn, other = Conn(), Conn()
    theirs = store.issue(other)
    mine = [store.issue(conn) for _ in range(6)]
    assert len(store) == 5 and not store.redeem(mine[0]) and not store.redeem(mine[1])
    assert all(store.redeem(c) for c in mine[2:]) and store.redeem(theirs)


def test_a_new_store_knows_nothing_of_an_old_ones_challenges() -> None:
    """A daemon restart: an offer captured before it has nothing to redeem."""
    old, new = ChallengeStore(), ChallengeStore()
    c = old.issue()
    assert not new.redeem(c)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["issue", "redeem-last", "redeem-first", "tick"]), max_size=60))
def test_no_sequence_redeems_a_challenge_twice(ops: list[str]) -> None:
    clock = Clock()
    store = ChallengeStore(ttl=10, cap=5, clock=clock)
    issued: list[tuple[bytes, float]] = []
    redeemed: set[bytes] = set()
    for op in ops:
        if op == "issue":
            issued.append((store.issue(), clock.now))
        elif op == "tick":
            clock.now += 3
        elif issued:
            c, at = issued[-1] if op == "redeem-last" else issued[0]
            ok = store.redeem(c)
            if ok:
                assert c not in redeemed and clock.now < at + 10
                redeemed.add(c)
    assert len(store) <= 5


def test_the_offer_mac_covers_the_challenge() -> None:
    offer = make_offer(b"s", 1, 2, b"c" * 32)
    assert offer.challenge == b"c" * 32
    assert offer.mac == offer_mac(b"s", offer.protocol_version, 1, 2, offer.timestamp_ms, b"c" * 32)
    assert offer.mac != offer_mac(b"s", offer.protocol_version, 1, 2, offer.timestamp_ms, b"d" * 32)


def test_the_macs_cover_the_daemon_id() -> None:
    """A handshake's daemon id decides which links share one heartbeat: a man in the middle who swaps it (to hide a
    hung daemon behind a live one) breaks the mac, in the offer and in the answer."""
    offer = make_offer(b"s", 1, 2, b"c" * 32, daemon_id=b"a" * 16)
    assert offer.mac == offer_mac(b"s", offer.protocol_version, 1, 2, offer.timestamp_ms, b"c" * 32, b"a" * 16)
    assert offer.mac != offer_mac(b"s", offer.protocol_version, 1, 2, offer.timestamp_ms, b"c" * 32, b"b" * 16)
    good = answer_mac(b"s", b"c" * 32, b"n" * 16, 1, "tcp://127.0.0.1:1", b"a" * 16)
    assert good != answer_mac(b"s", b"c" * 32, b"n" * 16, 1, "tcp://127.0.0.1:1", b"b" * 16)
