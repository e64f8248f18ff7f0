"""``GrantedReads``: pulls by READ of what the owner grants per pull (the ``grant_read`` / ``done_read`` owner
calls; ``transport.base.ReadGrants``). The hccl transport's pull: its memory is bound to a link's communicator
before Prepare, so it does not publish tables yet (docs/ascend.md); nixl reads published tables (``tables``)."""

from __future__ import annotations

import struct
import time
from typing import Sequence

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...memory.base import Segment
from ..base import Channel
from .transport import OneSidedTransport, _peer_of
from .wire import MD_LEN

__all__ = ["GrantedReads"]


class GrantedReads(OneSidedTransport):
    """A one-sided transport whose pulls read what the owner grants per pull."""

    def grant(self, channel: Channel, segments: Sequence[Segment]) -> bytes:
        """The owner's side of a pull: what the peer at the other end of ``channel`` needs to READ ``segments`` --
        the partial metadata of registrations it has not been sent yet, then the extents (``u32`` metadata length,
        metadata, ``(u64 address, u64 length)`` extents). No byte moves here."""
        peer = _peer_of(self.name, channel)
        extents, metadata, missing = self._describe(peer, segments)
        peer.shipped.update(reg.serial for reg in missing)
        if self.progress_window:
            self._progress_until = time.monotonic() + self.progress_window
        return MD_LEN.pack(len(metadata)) + metadata + np.ascontiguousarray(extents, dtype=np.uint64).tobytes()

    def read(self, channel: Channel, grant: bytes, segments: Sequence[Segment], deadline: float) -> None:
        """The puller's side: one READ of the extents a ``grant`` of the owner names into ``segments`` (this side's
        memory), returning when every byte is in. The grant's extents are the owner's memory only: what lands here
        is bounded by ``segments``, whose byte count must equal the grant's."""
        peer = _peer_of(self.name, channel)
        agent = self._agent()
        try:
            (size,) = MD_LEN.unpack_from(grant)
            at = MD_LEN.size + size
            if len(grant) < at or (len(grant) - at) % 16:
                raise ValueError("truncated")
        except (struct.error, ValueError):
            raise DataDistError(LLMStatusCode.LLM_FAILED, f"{self.name}: a malformed read grant from the peer "
                                                          f"{peer.what}") from None
        if not peer.ready.wait(max(0.0, deadline - time.monotonic())) or peer.agent_name is None:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"the peer {peer.what} never sent its agent metadata")
        if size and agent.add_peer(grant[MD_LEN.size:at], peer.token) != peer.agent_name:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{self.name}: the read grant of {peer.what} "
                                                               f"describes another agent")
        remote = np.frombuffer(grant, dtype=np.uint64, offset=at).reshape(-1, 2)
        src, dst = self._paired(remote, segments, LLMStatusCode.LLM_FAILED, f"the read grant of {peer.what}")
        if not len(src):
            return
        tid = self._next_id()
        peer.reading(int(tid))    # the peer's agent stays loaded until this READ ended (``LinkPeer.sent``)
        try:
            agent.read(dst, src, peer.agent_name, deadline)
        except DataDistError as exc:
            if exc.code == LLMStatusCode.LLM_TIMEOUT:   # may still be in flight
                self._abandon_read(peer, exc)
            raise
        finally:
            peer.sent(int(tid))
        self.bytes_received += int(src[:, 1].sum())
