"""The owner-call frames (``ownerwire``, the one wire encoding of owner calls): every call kind and every field
round-trips at its bounds, and a frame that is cut short, too long or out of range is refused -- with the call's
id when it names one (the other end gets an answer), without when it does not even name that. Decoding is what a
hostile peer reaches: whatever the bytes, it raises nothing but ``DataDistError`` (``RefusedCall`` included)."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.plan import AddrRef
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import (
    MAX_OPEN_PER_CALL,
    CommitWriteCmd,
    NotifyCmd,
    OpenWriteCmd,
    OwnerReply,
    PingCmd,
    ReadCmd,
    RefusedCall,
    ReleaseCmd,
    UnlinkCmd,
    WriteCmd,
)

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
RELEASED_KEYS = st.one_of(st.builds(CacheKeyRef, U64, U64, U64, U64), st.builds(IdIndexRef, U64, I64, U32))
KEYS = st.one_of(RELEASED_KEYS, st.builds(BlocksKeyRef, U64, U64),
                st.builds(AddrRef, U64, st.integers(1, 2**64 - 1), U64))   # a layer-wise push's raw dst_addrs
SPECS = st.builds(RemoteSpec, KEYS, st.sampled_from(list(ReadMode)), st.lists(U64, max_size=300).map(tuple), I64,
                  U64, U32, U32, U64)
CALLS = st.one_of(
    st.builds(ReadCmd, U64, U64, SPECS, U32, st.booleans()),
    st.builds(OpenWriteCmd, U64, st.lists(SPECS, min_size=1, max_size=5).map(tuple), U32, U32),
    st.builds(CommitWriteCmd, U64, st.lists(U64, max_size=50).map(tuple), U32),
    st.builds(ReleaseCmd, U64, RELEASED_KEYS, U32, U32),
    st.builds(UnlinkCmd, U64), st.builds(PingCmd, U64),
    st.builds(NotifyCmd, U64, st.binary(max_size=1024), st.binary(max_size=1024)),
    st.tuples(U64, SPECS, U32, st.binary(max_size=600)).map(   # a small push: its bytes are its spec's count
        lambda t: WriteCmd(t[0], replace(t[1], expected_bytes=len(t[3])), t[2], t[3])))
REPLIES = st.builds(OwnerReply, U64, I64, st.text(max_size=200), st.lists(U64, max_size=50).map(tuple), U64,
                    st.booleans(), st.binary(max_size=5000))


@given(CALLS)
def test_every_call_round_trips(cmd) -> None:  # noqa: ANN001
    frame = ownerwire.encode_call(cmd)
    assert frame[0] == ownerwire.TAG
    assert ownerwire.decode_call(frame) == cmd


@given(REPLIES)
def test_a_reply_round_trips(reply: OwnerReply) -> None:
    assert ownerwire.decode_reply(ownerwire.encode_reply(reply)) == reply


def _read(**kw: object) -> ReadCmd:
    spec = RemoteSpec(BlocksKeyRef(1, 0), ReadMode.BLOCKS, (1, 2, 3), -1, 0, 0, 0, 4096)
    return ReadCmd(**{"command_id": 7, "transfer_id": 0, "spec": spec, "timeout_ms": 1000,
                      "inline": True, **kw})  # type: ignore[arg-type]


@given(st.integers(0, 120))
def test_a_read_cut_short_is_refused(cut: int) -> None:
    frame = ownerwire.encode_call(_read())
    with pytest.raises(DataDistError) as info:
        ownerwire.decode_call(frame[:cut] if cut < ownerwire.READ.size else frame[:-1 - cut % 8])
    assert info.value.code == S.LLM_PARAM_INVALID


def test_a_read_with_bytes_left_over_is_refused_with_its_id() -> None:
    with pytest.raises(RefusedCall) as info:
        ownerwire.decode_call(ownerwire.encode_call(_read()) + b"\0" * 8)
    assert info.value.command_id == 7 and info.value.code == S.LLM_PARAM_INVALID


def _patched(layout: struct.Struct, frame: bytes, field: int, value: int) -> bytes:
    fields = list(layout.unpack_from(frame))
    fields[field] = value
    return layout.pack(*fields) + frame[layout.size:]


#: READ's fields: 0 tag, 1 op, 2 flags, 3 timeout, 4 command id, 5 transfer id, then the spec: 6 key kind,
#: 7-8 reserved, 9-12 key, 13 mode, 14 reserved, 15 blocks, ...
@pytest.mark.parametrize("field,value,what", [
    (6, 9, "key kind"), (6, 0, "no key"), (7, 1, "key reserved"), (8, 1, "key reserved"), (13, 7, "mode"),
    (2, 0x8, "flags"), (14, 1, "reserved"), (15, ownerwire.MAX_BLOCKS + 1, "blocks")])
def test_a_read_out_of_range_is_refused_with_its_id(field: int, value: int, what: str) -> None:
    """A hostile peer naming a huge block count or a reserved field is refused before anything is allocated for it."""
    with pytest.raises(RefusedCall) as info:
        ownerwire.decode_call(_patched(ownerwire.READ, ownerwire.encode_call(_read()), field, value))
    assert info.value.command_id == 7 and info.value.code == S.LLM_PARAM_INVALID, what


SPEC = RemoteSpec(CacheKeyRef(1, 2, 3, 4), ReadMode.BLOCKS, (5, 6), -1, 0, 0, 0, 64)


def _piece_patched(field: int, value: int) -> bytes:
    """An open write of two pieces whose second piece has ``field`` (of ``ownerwire.SPEC``) set to ``value``."""
    frame = ownerwire.encode_call(OpenWriteCmd(7, (SPEC, SPEC), 100))
    at = ownerwire.OPEN.size + ownerwire.SPEC.size
    return frame[:at] + _patched(ownerwire.SPEC, frame[at:], field, value)


@pytest.mark.parametrize("frame,what", [
    (_patched(ownerwire.READ, ownerwire.encode_call(ReadCmd(7, 1, SPEC, 100)), 2, 2), "read flags"),
    (_patched(ownerwire.OPEN, ownerwire.encode_call(OpenWriteCmd(7, (SPEC,), 100)), 6, 0), "no piece"),
    (_patched(ownerwire.OPEN, ownerwire.encode_call(OpenWriteCmd(7, (SPEC,), 100)), 6, 2), "a piece missing"),
    (_patched(ownerwire.OPEN, ownerwire.encode_call(OpenWriteCmd(7, (SPEC,), 100)), 6, MAX_OPEN_PER_CALL + 1),
     "too many pieces"),
    (_patched(ownerwire.OPEN, ownerwire.encode_call(OpenWriteCmd(7, (SPEC, SPEC), 100)), 6, 1), "bytes left over"),
    (ownerwire.encode_call(OpenWriteCmd(7, (SPEC,), 100))[:-8], "a block missing"),
    (_piece_patched(9, ownerwire.MAX_BLOCKS + 1), "a piece of too many blocks"),
    (_piece_patched(7, 5), "a piece of an unknown mode"),
    (_piece_patched(0, 0), "a piece naming no key"),
    (ownerwire.encode_call(OpenWriteCmd(7, (replace(SPEC, key=AddrRef(1, 0, 64)),), 100)), "raw address 0"),
    (_patched(ownerwire.COMMIT, ownerwire.encode_call(CommitWriteCmd(7, (1, 2), 100)), 5, 3), "an id missing"),
    (_patched(ownerwire.COMMIT, ownerwire.encode_call(CommitWriteCmd(7, (1, 2), 100)), 5, MAX_OPEN_PER_CALL + 1),
     "too many transfers"),
    (_patched(ownerwire.COMMIT, ownerwire.encode_call(CommitWriteCmd(7, (1,), 100)), 6, 1), "commit reserved"),
    (_patched(ownerwire.RELEASE, ownerwire.encode_call(ReleaseCmd(7, CacheKeyRef(1, 2, 3), 0, 1)), 5, 3),
     "a release of a blocks key"),
    (ownerwire.encode_call(ReleaseCmd(7, CacheKeyRef(1, 2, 3), 0, 1)) + b"\0", "release bytes left over"),
    (ownerwire.encode_call(PingCmd(7)) + b"\0", "ping bytes left over"),
    (_patched(ownerwire.HEAD, ownerwire.encode_call(UnlinkCmd(7)), 3, 1), "unlink reserved"),
    (_patched(ownerwire.HEAD, ownerwire.encode_call(PingCmd(7)), 1, 0), "op 0"),
    (_patched(ownerwire.HEAD, ownerwire.encode_call(PingCmd(7)), 1, 2), "a read grant (retired op 2)"),
    (_patched(ownerwire.HEAD, ownerwire.encode_call(PingCmd(7)), 1, 8), "a read grant's end (retired op 8)"),
    (_patched(ownerwire.HEAD, ownerwire.encode_call(PingCmd(7)), 1, 11), "an unknown op"),
    (_patched(ownerwire.NOTIFY, ownerwire.encode_call(NotifyCmd(7, b"n", b"m")), 5, 1025), "a notify name too long"),
    (_patched(ownerwire.NOTIFY, ownerwire.encode_call(NotifyCmd(7, b"n", b"m")), 6, 1 << 31), "a notify too long"),
    (_patched(ownerwire.NOTIFY, ownerwire.encode_call(NotifyCmd(7, b"n", b"m")), 6, 2), "a notify cut short"),
    (ownerwire.encode_call(NotifyCmd(7, b"n", b"m")) + b"\0", "notify bytes left over"),
    (_patched(ownerwire.NOTIFY, ownerwire.encode_call(NotifyCmd(7, b"n", b"m")), 3, 5), "a notify's timeout"),
    (ownerwire.encode_call(_read())[:ownerwire.HEAD.size], "a read of its head only"),
])
def test_a_malformed_call_is_refused_with_its_id(frame: bytes, what: str) -> None:
    with pytest.raises(RefusedCall) as info:
        ownerwire.decode_call(frame)
    assert info.value.command_id == 7 and info.value.code == S.LLM_PARAM_INVALID, what


def test_a_spec_of_more_blocks_than_the_bound_is_refused_even_when_the_frame_holds_them() -> None:
    many = RemoteSpec(BlocksKeyRef(1, 0), ReadMode.BLOCKS, (0,) * (ownerwire.MAX_BLOCKS + 1), -1, 0, 0, 0, 1)
    for cmd in (ReadCmd(7, 1, many, 100), OpenWriteCmd(7, (SPEC, many), 100),
                WriteCmd(7, many, 100, b"\0")):
        with pytest.raises(RefusedCall) as info:
            ownerwire.decode_call(ownerwire.encode_call(cmd))
        assert info.value.command_id == 7 and "at most" in info.value.message, type(cmd).__name__


@pytest.mark.parametrize("frame", [b"", b"\xff", bytes(15), b"\xfe" + bytes(40), b"\x0a\x05abc" * 10])
def test_a_frame_that_names_no_call_is_refused_without_an_id(frame: bytes) -> None:
    with pytest.raises(DataDistError) as info:
        ownerwire.decode_call(frame)
    assert not isinstance(info.value, RefusedCall) and info.value.code == S.LLM_PARAM_INVALID


@pytest.mark.parametrize("mangle", [lambda f: f[:-1], lambda f: f + b"x", lambda f: f[:10], lambda f: b"\0" + f[1:]])
def test_a_malformed_reply_is_refused(mangle) -> None:  # noqa: ANN001
    frame = ownerwire.encode_reply(OwnerReply(3, 0, "fine", (1, 2), 10, True, b"0123456789"))
    with pytest.raises(DataDistError) as info:
        ownerwire.decode_reply(mangle(frame))
    assert info.value.code == S.LLM_PARAM_INVALID


def _hostile(draw, frame: bytes) -> bytes:  # noqa: ANN001
    """``frame`` with a few bytes overwritten (counts and lengths included), cut, or grown."""
    data = bytearray(frame)
    for _ in range(draw(st.integers(0, 4))):
        if data:
            at = draw(st.integers(0, len(data) - 1))
            data[at:at + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\0\0\0\0", b"\x01\0\0\0", b"\0\0\x10\0",
                                                    b"\x09", b"\x80"]))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut] if draw(st.booleans()) else data) + draw(st.binary(max_size=24))


@st.composite
def hostile_calls(draw) -> bytes:  # noqa: ANN001
    return draw(st.one_of(st.binary(max_size=200), CALLS.map(ownerwire.encode_call).map(lambda f: _hostile(draw, f))))


@st.composite
def hostile_replies(draw) -> bytes:  # noqa: ANN001
    return draw(st.one_of(st.binary(max_size=200),
                          REPLIES.map(ownerwire.encode_reply).map(lambda f: _hostile(draw, f))))


FUZZ = settings(max_examples=600, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(hostile_calls())
def test_decoding_any_call_bytes_raises_only_the_codecs_error(data: bytes) -> None:
    """Whatever a linked peer sends, decoding answers a call or ``DataDistError`` (``RefusedCall`` with the id the
    frame names) -- never another exception, and never a call whose frame would encode differently."""
    try:
        cmd = ownerwire.decode_call(data)
    except DataDistError as exc:
        assert exc.code == S.LLM_PARAM_INVALID
        return
    assert ownerwire.encode_call(cmd) == data


@FUZZ
@given(hostile_replies())
def test_decoding_any_reply_bytes_raises_only_the_codecs_error(data: bytes) -> None:
    try:
        ownerwire.decode_reply(data)
    except DataDistError as exc:
        assert exc.code == S.LLM_PARAM_INVALID


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=ownerwire.SMALL_READ_BLOCKS + 1, max_size=400),
       st.integers(1, 45), st.sampled_from([ownerwire.OP_READ, ownerwire.OP_OPEN_WRITE]))
def test_a_long_block_list_decodes_with_its_bounds_and_is_checked_as_the_plain_list(blocks: list[int], rows: int,
                                                                                   op: int) -> None:
    """A spec's long block list (past ``SMALL_READ_BLOCKS``) decodes into a ``BlockList``: equal to the plain tuple,
    its bounds known, so the owner refuses it by bisection (issue 44) -- with the same answer, the same first bad
    block named, as the element-by-element check of the plain list."""
    from datadistd.core.layout import block_spans
    from datadistd.core.types import BlockList, CacheDesc, DType

    spec = RemoteSpec(BlocksKeyRef(1, 0), ReadMode.BLOCKS, tuple(blocks), -1, 0, 0, 0, 0)
    cmd = ReadCmd(3, 0, spec, 0) if op == ownerwire.OP_READ else OpenWriteCmd(3, (spec,), 0)
    decoded = ownerwire.decode_call(ownerwire.encode_call(cmd))
    got = decoded.spec.blocks if isinstance(decoded, ReadCmd) else decoded.specs[0].blocks
    assert isinstance(got, BlockList) and got == tuple(blocks) and got.high == max(blocks)
    desc = CacheDesc(1, (rows, 4), DType.DT_UINT8)
    answers = []
    for listed in (got, tuple(blocks)):
        try:
            answers.append(block_spans(desc, [0], listed, "src").nbytes)
        except DataDistError as exc:
            answers.append(exc.message)
    assert answers[0] == answers[1]
    bad = next((i for i, b in enumerate(blocks) if b >= rows), None)
    assert (bad is None) == isinstance(answers[0], int)
    if bad is not None:
        assert f"src_blocks[{bad}] = {blocks[bad]} out of range" in answers[0]


# ---- a small pull's and push's frames: what ``links.fast`` sends, ``links.calls`` and ``take_reply`` read ----------

_CID, _TIMEOUT, _CLUSTER, _MODEL = 0x1122334455, 1500, 7, 9
_BLOCKS = (3, 0x0102030405060708)
_WORDS = struct.pack("<2Q", *_BLOCKS)   # as the attach frame carries them
_DATA = bytes(range(1, 65))
#: the bytes ``links/fast.py`` packed by hand before ``ownerwire`` wrote them: the wire must not change
_READ_BYTES = bytes.fromhex(
    "ff010100dc050000554433221100000000000000000000000300000007000000000000000000000000000000090000000000000000000000"
    "00000000000002000000ffffffffffffffff0000000000000000000000000000000040000000000000000300000000000000080706050403"
    "0201")
_WRITE_BYTES = bytes.fromhex(
    "ff090000dc050000554433221100000003000000070000000000000000000000000000000900000000000000000000000000000000000200"
    "0000ffffffffffffffff00000000000000000000000000000000400000000000000003000000000000000807060504030201") + _DATA
_SPEC = RemoteSpec(BlocksKeyRef(_CLUSTER, _MODEL), ReadMode.BLOCKS, _BLOCKS, -1, 0, 0, 0, len(_DATA))


def _small(**kw: object) -> dict[str, object]:
    return {"command_id": _CID, "timeout_ms": _TIMEOUT, "cluster_id": _CLUSTER, "model_id": _MODEL,
            "blocks": _WORDS, "nbytes": len(_DATA), **kw}


def test_a_small_pulls_read_is_the_pinned_bytes_and_round_trips() -> None:
    frame = ownerwire.small_read_call(**_small())  # type: ignore[arg-type]
    assert frame == _READ_BYTES
    cmd = ReadCmd(_CID, 0, _SPEC, _TIMEOUT, inline=True)
    assert ownerwire.decode_call(frame) == cmd and ownerwire.encode_call(cmd) == frame
    answer = ownerwire.encode_reply(OwnerReply(_CID, nbytes=len(_DATA), data=_DATA))
    assert ownerwire.small_call(frame, _CLUSTER) == (False, _CID, _MODEL, 0, 0, _BLOCKS, len(_DATA), 0,
                                                     answer[:ownerwire.REPLY_DATA])
    assert ownerwire.small_reply(answer) == (_CID, len(_DATA)) and answer[ownerwire.REPLY_DATA:] == _DATA


def test_a_small_pushs_write_is_the_pinned_bytes_and_round_trips() -> None:
    frame, at = ownerwire.small_write_call(**_small())  # type: ignore[arg-type]
    frame[at:] = _DATA
    assert bytes(frame) == _WRITE_BYTES
    cmd = WriteCmd(_CID, _SPEC, _TIMEOUT, _DATA)
    assert ownerwire.decode_call(bytes(frame)) == cmd and ownerwire.encode_call(cmd) == frame
    answer = ownerwire.encode_reply(OwnerReply(_CID, nbytes=len(_DATA)))
    assert ownerwire.small_call(bytes(frame), _CLUSTER) == (True, _CID, _MODEL, 0, 0, _BLOCKS, len(_DATA), at, answer)
    assert ownerwire.small_reply(answer) == (_CID, 0)


@given(U64, U32, U64, U64, st.lists(U64, max_size=ownerwire.SMALL_READ_BLOCKS).map(tuple), st.integers(0, 4096),
       st.booleans())
def test_the_small_frames_are_the_general_encoders_and_read_back(cid: int, timeout_ms: int, cluster: int,
                                                                 model: int, blocks: tuple[int, ...], nbytes: int,
                                                                 push: bool) -> None:
    kw = {"command_id": cid, "timeout_ms": timeout_ms, "cluster_id": cluster, "model_id": model,
          "blocks": struct.pack(f"<{len(blocks)}Q", *blocks), "nbytes": nbytes}
    spec = RemoteSpec(BlocksKeyRef(cluster, model), ReadMode.BLOCKS, blocks, -1, 0, 0, 0, nbytes)
    if push:
        frame, at = ownerwire.small_write_call(**kw)  # type: ignore[arg-type]
        frame[at:] = b"\x5a" * nbytes
        cmd: ReadCmd | WriteCmd = WriteCmd(cid, spec, timeout_ms, b"\x5a" * nbytes)
        reply = ownerwire.encode_reply(OwnerReply(cid, nbytes=nbytes))
    else:
        frame, at = bytearray(ownerwire.small_read_call(**kw)), 0  # type: ignore[arg-type]
        cmd = ReadCmd(cid, 0, spec, timeout_ms, inline=True)
        reply = ownerwire.encode_reply(OwnerReply(cid, nbytes=nbytes, data=bytes(nbytes)))[:ownerwire.REPLY_DATA]
    assert ownerwire.encode_call(cmd) == frame and ownerwire.decode_call(bytes(frame)) == cmd
    assert ownerwire.small_call(bytes(frame), cluster) == (push, cid, model, 0, 0, blocks, nbytes, at, reply)
    assert ownerwire.small_call(bytes(frame), cluster ^ 1) is None   # another cluster's key: the general path


@pytest.mark.parametrize("reply", [
    OwnerReply(_CID, int(S.LLM_KV_CACHE_NOT_EXIST), "gone"), OwnerReply(_CID, message="a message"),
    OwnerReply(_CID, transfer_ids=(1,)), OwnerReply(_CID, release_needed=True)])
def test_only_a_plain_success_is_a_small_reply(reply: OwnerReply) -> None:
    """Anything but a success carrying data alone is the event loop's (``decode_reply``, the general path's codes)."""
    frame = ownerwire.encode_reply(reply)
    assert ownerwire.small_reply(frame) is None
    assert ownerwire.small_reply(ownerwire.encode_reply(OwnerReply(_CID, data=b"ab"))[:-1]) is None
