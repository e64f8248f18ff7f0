"""The attach connection's binary pull/push frames (``datadist.fastframe``) and the daemon's order from them
(``datadistd.api.orders``): every field round-trips at its type's edges, malformed frames are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datadist import fastframe as ff
from datadist.v1 import attach_pb2
from datadistd.api.grpc import convert
from datadistd.api.orders import order_from_frame
from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.plan import TransferKind
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef
from llm_datadist._convert import transfer_pb

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
U32 = st.integers(0, 2**32 - 1)
BLOCKS = st.lists(U64, max_size=300).map(tuple) | st.just(tuple(range(4000)))
RANGE = st.none() | st.tuples(I64, I64)


@st.composite
def frames(draw: st.DrawFn) -> ff.TransferFrame:
    key_kind = draw(st.sampled_from([ff.KEY_CACHE, ff.KEY_BY_ID, ff.KEY_BLOCKS]))
    if key_kind == ff.KEY_CACHE:
        key = (draw(U64), draw(U64), draw(U64), draw(U64))
    elif key_kind == ff.KEY_BY_ID:
        key = (draw(U64), draw(I64), draw(U32), 0)
    else:
        key = (draw(U64), draw(U64), 0, 0)
    return ff.TransferFrame(
        draw(st.sampled_from([ff.PULL, ff.PUSH])), draw(U64), draw(st.integers(0, 255)), key_kind, key, draw(I64),
        draw(BLOCKS), draw(BLOCKS), draw(U32), draw(I64), draw(U32), draw(RANGE), draw(RANGE),
        draw(st.none() | U32), draw(st.none() | U64), draw(st.none() | U64), draw(st.booleans()))


@given(frames(), U64)
def test_every_field_round_trips(frame: ff.TransferFrame, rid: int) -> None:
    data = ff.encode_request(rid, frame)
    assert data[0] == ff.MAGIC and len(data) == ff.REQUEST.size + 8 * (len(frame.remote_blocks) +
                                                                       len(frame.local_blocks))
    assert ff.decode_request(data) == (rid, frame)
    assert ff.request_id_of(data) == rid


@given(frames(), U64, st.data())
def test_a_truncated_or_padded_frame_is_refused_with_its_request_id(frame: ff.TransferFrame, rid: int,
                                                                    data: st.DataObject) -> None:
    whole = ff.encode_request(rid, frame)
    cut = data.draw(st.integers(0, len(whole) - 1))
    with pytest.raises(ff.FrameError) as info:
        ff.decode_request(whole[:cut])
    assert info.value.request_id == (rid if cut >= 16 else None)
    with pytest.raises(ff.FrameError) as info:
        ff.decode_request(whole + b"\0" * data.draw(st.integers(1, 16)))
    assert info.value.request_id == rid


def test_a_frame_of_another_op_magic_or_flags_is_refused() -> None:
    good = ff.encode_request(7, ff.TransferFrame(ff.PULL, 1, 1, ff.KEY_BLOCKS, (2, 0, 0, 0), 3, (1,), (2,)))
    for at, value in ((0, 0xFE), (1, 0), (1, 4), (4, 0x80), (4, 0x40)):   # 0x40: more follow, but all are in
        bad = bytearray(good)
        bad[at] = value
        with pytest.raises(ff.FrameError) as info:
            ff.decode_request(bytes(bad))
        assert info.value.request_id == 7


def _assemble(frames: list[bytes]) -> tuple[int, ff.TransferFrame]:
    rid, got = ff.decode_request(frames[0])
    if isinstance(got, ff.TransferFrame):
        assert len(frames) == 1
        return rid, got
    for more in frames[1:]:
        assert got.missing
        got.add(more)
    assert not got.missing
    return rid, got.frame()


@given(frames(), U64, st.integers(0, 20_000), st.integers(0, 20_000))
def test_a_transfer_of_any_length_goes_in_frames_of_one_datagram_each(frame: ff.TransferFrame, rid: int,
                                                                      nr: int, nl: int) -> None:
    frame = frame._replace(remote_blocks=tuple(range(nr)), local_blocks=tuple(range(2**64 - nl, 2**64)))
    out = ff.encode_frames(rid, frame)
    assert all(len(d) <= ff.MAX_DATAGRAM for d in out)
    assert len(out) == 1 if ff.REQUEST.size + 8 * (nr + nl) <= ff.MAX_DATAGRAM else len(out) > 1
    assert _assemble(out) == (rid, frame)
    assert all(ff.is_continuation(d) and ff.request_id_of(d) == rid for d in out[1:])


def _long(rid: int = 5) -> list[bytes]:
    return ff.encode_frames(rid, ff.TransferFrame(ff.PUSH, 1, 1, ff.KEY_BLOCKS, (2, 0, 0, 0), 3,
                                                  tuple(range(9000)), tuple(range(9000))))


def test_a_continuation_that_is_not_the_next_of_its_transfer_is_refused_with_its_request_id() -> None:
    first, second, third = _long()
    cases = {
        "another request": second[:8] + (6).to_bytes(8, "little") + second[16:],
        "more than announced": second + third,
        "no block": second[:16],
        "half a block": second[:-4],
        "nonzero padding": second[:5] + b"\1" + second[6:],
    }
    for what, bad in cases.items():
        partial = ff.decode_request(first)[1]
        assert isinstance(partial, ff.Partial)
        with pytest.raises(ff.FrameError) as info:
            partial.add(bad)
        assert info.value.request_id == ff.request_id_of(bad), what


def test_a_first_frame_saying_more_follow_must_leave_some_out() -> None:
    whole = bytearray(ff.encode_request(5, ff.TransferFrame(ff.PULL, 1, 1, ff.KEY_BLOCKS, (2, 0, 0, 0), 3, (1,),
                                                            (2,))))
    whole[4] |= 0x40
    with pytest.raises(ff.FrameError, match="more follow") as info:
        ff.decode_request(bytes(whole))
    assert info.value.request_id == 5


def test_a_frame_claiming_more_blocks_than_it_carries_is_refused() -> None:
    good = bytearray(ff.encode_request(5, ff.TransferFrame(ff.PULL, 1, 1, ff.KEY_BLOCKS, (2, 0, 0, 0), 3, (1,),
                                                           (2,))))
    good[136:140] = (2**32 - 1).to_bytes(4, "little")     # n_remote: far beyond any datagram
    with pytest.raises(ff.FrameError, match="blocks is"):
        ff.decode_request(bytes(good))


@pytest.mark.parametrize("field", ["engine_id", "local_cache_id", "local_batch_index", "size", "timeout_ms"])
def test_a_field_out_of_its_type_is_not_encoded(field: str) -> None:
    frame = ff.TransferFrame(ff.PULL, 1, 1, ff.KEY_BLOCKS, (2, 0, 0, 0), 3)
    with pytest.raises(ValueError):
        ff.encode_request(1, frame._replace(**{field: 2**64}))
    with pytest.raises(ValueError):
        ff.encode_request(1, frame._replace(remote_blocks=(-1,)))


@given(U64, I64, U64, st.text(max_size=16).filter(lambda t: len(t.encode()) <= 16 and "\0" not in t), st.text())
def test_replies_round_trip(rid: int, status: int, nbytes: int, transport: str, message: str) -> None:
    reply = ff.decode_reply(ff.encode_reply(rid, status, nbytes, transport, message))
    assert reply == ff.FrameReply(rid, status, nbytes, transport, message)


def test_magic_never_starts_a_protobuf_message() -> None:
    """0xFF is field 31 of wire type 7, which does not exist: no valid message starts with it."""
    for raw in (bytes([ff.MAGIC]), ff.encode_request(1, ff.TransferFrame(ff.PULL, 1, 1, 1, (1, 1, 1, 1), 1)),
                ff.encode_reply(1)):
        with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError
            attach_pb2.AttachRequest.FromString(raw)
        with pytest.raises(Exception):  # noqa: B017
            attach_pb2.AttachReply.FromString(raw)
    assert attach_pb2.AttachRequest(request_id=2**64 - 1).SerializeToString()[0] != ff.MAGIC


@given(frames())
def test_the_daemon_orders_a_frame_as_it_orders_the_same_protobuf(frame: ff.TransferFrame) -> None:
    """``order_from_frame`` and ``convert.order_from_pb`` (the client's ``transfer_pb`` of the same frame): the
    same order, or the same refusal."""
    def outcome(fn, arg):  # noqa: ANN001, ANN202
        try:
            return fn(arg)
        except DataDistError as exc:
            return exc.code, exc.message
    assert outcome(order_from_frame, frame) == outcome(convert.order_from_pb, transfer_pb(frame))


def test_the_order_carries_each_key_kind() -> None:
    base = ff.TransferFrame(ff.PULL, 1, 1, ff.KEY_CACHE, (2, 3, 4, 5), 6, (1, 2), (3, 4), 0, -1, 0, (0, 1), (1, 2),
                            None, None, 8, True)
    order = order_from_frame(base)
    assert order.kind == TransferKind.BLOCKS and order.remote == CacheKeyRef(2, 3, 4, 5)
    assert (order.remote_blocks, order.local_blocks, order.src_layers, order.dst_layers) == ((1, 2), (3, 4), (0, 1),
                                                                                              (1, 2))
    assert (order.tensor_num_per_layer, order.src_offset, order.dst_offset, order.exclusive) == (2, 0, 8, True)
    assert order_from_frame(base._replace(key_kind=ff.KEY_BY_ID, key=(2, -1, 7, 0))).remote == IdIndexRef(2, -1, 7)
    assert order_from_frame(base._replace(key_kind=ff.KEY_BLOCKS, key=(2, 9, 0, 0))).remote == BlocksKeyRef(2, 9)
    for bad in (base._replace(key_kind=0), base._replace(kind=2), base._replace(src_layers=(3, 3)),
                base._replace(key_kind=ff.KEY_BLOCKS, key=(2, 9, 1, 0))):
        with pytest.raises(DataDistError) as info:
            order_from_frame(bad)
        assert info.value.code == StatusCode.LLM_PARAM_INVALID
