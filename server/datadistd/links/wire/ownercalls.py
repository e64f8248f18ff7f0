"""Owner calls between the two ends of a link: their records.

After the Peer handshake the link's authenticated data channel is the only conversation between two
daemons (since peer protocol 3). Either end may pull and push over a link (CANN's links have two ends; client
and server say nothing about prompt and decoder), so either end makes *owner calls* on the other: ``read``
/ ``release`` for a pull (over nixl and hccl the puller reads the owner's published table and calls only
``release``, for a key the pull consumes), ``open_write`` /
``commit_write`` for a push, ``unlink``, and ``ping`` (the linking end's heartbeat and ``check_link_status``).
A call is one CALL frame, its answer one REPLY frame (``ownerwire``: the one encoding of these records),
sent and matched by ``framecalls.FrameCalls``; the bytes of a transfer travel on the same channel.
No grpc and no protobuf here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

from ...core.errors import DataDistError, StatusCode
from ...core.types import CacheKeyRef, IdIndexRef, RemoteSpec

__all__ = ["WriteCmd", "OpenWriteCmd", "CommitWriteCmd", "ReadCmd", "ReleaseCmd", "UnlinkCmd", "PingCmd", "OwnerCall",
           "OwnerReply", "RefusedCall", "MAX_OPEN_PER_CALL", "INLINE_READ_MAX",
           "checked_ids"]



@dataclass(frozen=True)
class OpenWriteCmd:
    """Open one incoming transfer per spec (a layer-wise push opens every layer of a target at once);
    they may wait ``hold_ms`` for their bytes and commit (0: ``timeout_ms``)."""

    command_id: int
    specs: tuple[RemoteSpec, ...]
    timeout_ms: int
    hold_ms: int = 0


@dataclass(frozen=True)
class CommitWriteCmd:
    """Wait until every byte of the named transfers arrived (they end together: the first failure
    cancels the rest)."""

    command_id: int
    transfer_ids: tuple[int, ...]
    timeout_ms: int


@dataclass(frozen=True)
class ReadCmd:
    """Send what ``spec`` names: as transfer ``transfer_id`` on the data channel, or (``inline``: a small read,
    at most ``INLINE_READ_MAX`` bytes) in the reply itself."""

    command_id: int
    transfer_id: int
    spec: RemoteSpec
    timeout_ms: int
    inline: bool = False


@dataclass(frozen=True)
class WriteCmd:
    """A small push carrying its bytes (at most ``INLINE_READ_MAX``, exactly ``spec.expected_bytes``): write
    ``data`` into what ``spec`` names and answer -- one call instead of OpenWrite, a DATA frame and CommitWrite."""

    command_id: int
    spec: RemoteSpec
    timeout_ms: int
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class ReleaseCmd:
    command_id: int
    key: "CacheKeyRef | IdIndexRef"
    tensor_start: int
    tensor_count: int


@dataclass(frozen=True)
class UnlinkCmd:
    command_id: int


@dataclass(frozen=True)
class PingCmd:
    """Liveness: answered at once (the answer proves the other end and the channel are alive)."""

    command_id: int


@dataclass(frozen=True)
class NotifyCmd:
    """A HIXL notify for the owner engine's queue (``engine.notifies``: HIXL's bounds)."""

    command_id: int
    name: bytes
    msg: bytes


OwnerCall = Union[WriteCmd, OpenWriteCmd, CommitWriteCmd, ReadCmd, ReleaseCmd, UnlinkCmd, PingCmd, NotifyCmd]


@dataclass(frozen=True)
class OwnerReply:
    command_id: int
    status: int = 0
    message: str = ""
    transfer_ids: tuple[int, ...] = ()   # open write: one per spec, in order
    nbytes: int = 0                 # read: bytes sent
    release_needed: bool = False    # read: confirm the receipt with a release
    data: bytes = b""               # inline read: the bytes themselves


#: the largest read answered with its bytes in the reply (``ReadCmd.inline``): a small pull then needs no transfer
#: on the data channel, no receipt at the requester and no pin at the owner past the copy into the reply
INLINE_READ_MAX = 64 << 10

#: most transfers one OpenWrite may open (a layer-wise push opens a target's layers at once: a model's
#: layers, up to two parts each); more is refused with ``LLM_PARAM_INVALID`` before anything is opened
MAX_OPEN_PER_CALL = 2048


def checked_ids(ids: Sequence[int], asked: int, who: str) -> list[int]:
    """The transfer ids an OpenWrite answered: one per spec asked for, else the other end is not this protocol's."""
    if len(ids) != asked:
        raise DataDistError(StatusCode.LLM_FAILED, f"{who} opened {len(ids)} transfers for {asked} parts "
                                                   f"(a daemon of another version?)")
    return list(ids)


class RefusedCall(DataDistError):
    """A CALL frame that decoded far enough to name its ``command_id`` but asks for something invalid: the
    other end gets a REPLY with ``code`` (a frame that does not decode at all is dropped, unanswered)."""

    def __init__(self, command_id: int, code: StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.command_id = command_id
