"""The fixed-layout owner-call frames (``ownerwire``): every field round-trips at its bounds, and a frame that is
cut short, too long or out of range is refused -- with the call's id when it names one (the other end gets an
answer), without when it does not even name that."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datadist.status import LLMStatusCode as S
from datadistd.api.grpc.convert import CALL_CODEC
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import OwnerReply, ReadCmd, RefusedCall

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
KEYS = st.one_of(st.builds(CacheKeyRef, U64, U64, U64, U64), st.builds(IdIndexRef, U64, I64, U32),
                 st.builds(BlocksKeyRef, U64, U64))
SPECS = st.builds(RemoteSpec, KEYS, st.sampled_from(list(ReadMode)), st.lists(U64, max_size=300).map(tuple), I64,
                  U64, U32, U32, U64)
READS = st.builds(ReadCmd, U64, U64, SPECS, U32, st.booleans())
REPLIES = st.builds(OwnerReply, U64, I64, st.text(max_size=200), st.lists(U64, max_size=50).map(tuple), U64,
                    st.booleans(), st.binary(max_size=5000), st.binary(max_size=300))


@given(READS)
def test_a_read_round_trips_through_the_codec(cmd: ReadCmd) -> None:
    frame = CALL_CODEC.encode_command(cmd)
    assert frame[0] == ownerwire.TAG
    assert CALL_CODEC.decode_command(frame) == cmd


@given(REPLIES)
def test_a_reply_round_trips_through_the_codec(reply: OwnerReply) -> None:
    assert CALL_CODEC.decode_reply(CALL_CODEC.encode_reply(reply)) == reply


def _read(**kw: object) -> ReadCmd:
    spec = RemoteSpec(BlocksKeyRef(1, 0), ReadMode.BLOCKS, (1, 2, 3), -1, 0, 0, 0, 4096)
    return ReadCmd(**{"command_id": 7, "transfer_id": 0, "spec": spec, "timeout_ms": 1000,
                      "inline": True, **kw})  # type: ignore[arg-type]


@given(st.integers(0, 60))
def test_a_read_cut_short_is_refused(cut: int) -> None:
    frame = ownerwire.encode_read(_read())
    with pytest.raises(DataDistError) as info:
        ownerwire.decode_read(frame[:cut] if cut < ownerwire._READ.size else frame[:-1 - cut % 8])
    assert info.value.code == S.LLM_PARAM_INVALID


def test_a_read_with_bytes_left_over_is_refused_with_its_id() -> None:
    with pytest.raises(RefusedCall) as info:
        ownerwire.decode_read(ownerwire.encode_read(_read()) + b"\0" * 8)
    assert info.value.command_id == 7 and info.value.code == S.LLM_PARAM_INVALID


def _patched(frame: bytes, field: int, value: int) -> bytes:
    fields = list(ownerwire._READ.unpack_from(frame))
    fields[field] = value
    return ownerwire._READ.pack(*fields) + frame[ownerwire._READ.size:]


@pytest.mark.parametrize("field,value,what", [
    (2, 9, "key kind"), (3, 7, "mode"), (4, 0x8, "flags"), (5, 1, "reserved"),
    (7, ownerwire.MAX_BLOCKS + 1, "blocks")])
def test_a_read_out_of_range_is_refused_with_its_id(field: int, value: int, what: str) -> None:
    """A hostile peer naming a huge block count or a reserved field is refused before anything is allocated for it."""
    with pytest.raises(RefusedCall) as info:
        ownerwire.decode_read(_patched(ownerwire.encode_read(_read()), field, value))
    assert info.value.command_id == 7 and info.value.code == S.LLM_PARAM_INVALID, what


def test_an_unknown_binary_call_is_dropped_unanswered() -> None:
    frame = ownerwire.encode_read(_read())
    with pytest.raises(DataDistError) as info:
        CALL_CODEC.decode_command(frame[:1] + b"\x09" + frame[2:])
    assert not isinstance(info.value, RefusedCall) and info.value.code == S.LLM_PARAM_INVALID


@pytest.mark.parametrize("mangle", [lambda f: f[:-1], lambda f: f + b"x", lambda f: f[:10]])
def test_a_malformed_reply_is_refused(mangle) -> None:  # noqa: ANN001
    frame = ownerwire.encode_reply(OwnerReply(3, 0, "fine", (1, 2), 10, True, b"0123456789", b"grant"))
    with pytest.raises(DataDistError) as info:
        CALL_CODEC.decode_reply(mangle(frame))
    assert info.value.code == S.LLM_PARAM_INVALID


def test_no_protobuf_message_starts_like_a_binary_frame() -> None:
    """What tells the two apart: a protobuf OwnerCall never starts with the tag (wire type 7 does not exist)."""
    from datadistd.links.wire.ownercalls import PingCmd

    assert CALL_CODEC.encode_command(PingCmd(1))[0] != ownerwire.TAG
    assert isinstance(CALL_CODEC.decode_command(CALL_CODEC.encode_command(PingCmd(1))), PingCmd)
