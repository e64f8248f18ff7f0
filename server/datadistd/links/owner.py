"""The owning side of a transfer: serve a read (send the bytes), open and commit a write (receive them)."""

from __future__ import annotations

import time

from ..core.errors import DataDistError, StatusCode
from ..core.types import CacheKeyRef, IdIndexRef, RemoteSpec, TransferId
from ..metrics import track_transfer
from .core import LinkCore
from .model import Link, _PendingWrite


class Owner(LinkCore):
    async def serve_read(self, session: bytes, transfer_id: int, spec: RemoteSpec,
                         timeout_ms: int) -> tuple[int, bool]:
        return await self.read_for(self.session_link(session), transfer_id, spec, timeout_ms)

    async def read_for(self, link: Link, transfer_id: int, spec: RemoteSpec, timeout_ms: int) -> tuple[int, bool]:
        """Owner side of a pull at either end of ``link``: send what ``spec`` names over its data channel."""
        channel = self._channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "no live data connection for this link")
        with track_transfer(self.node.metrics, "serve_read", self.cluster_id, link.remote_cluster) as tracked:
            cache_id, src, release = self.engine.prepare_read(spec)
            timeout = timeout_ms or self.engine.options.sync_kv_timeout_ms
            deadline = time.monotonic() + timeout / 1000
            try:
                # a small read goes out from the event loop when a connection is idle (no executor hop)
                if not channel.try_send(TransferId(transfer_id), src, deadline):
                    await self._in_thread(channel.send, TransferId(transfer_id), src, deadline)
            finally:
                self.engine.unpin(cache_id)
            tracked.done(spec.expected_bytes, len(spec.blocks))
        link.bytes_out += spec.expected_bytes
        return spec.expected_bytes, release

    def serve_release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int,
                      tensor_count: int) -> None:
        self.session_link(session)
        self.engine.release_pulled(key, tensor_start, tensor_count)

    def serve_open_write(self, session: bytes, spec: RemoteSpec, timeout_ms: int) -> int:
        return self.open_write_for(self.session_link(session), spec, timeout_ms)

    def open_write_for(self, link: Link, spec: RemoteSpec, timeout_ms: int) -> int:
        channel = self._channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "no live data connection for this link")
        cache_id, dst = self.engine.prepare_write(spec)
        receipt = self.transport.expect(dst, channel=channel)
        timeout = timeout_ms or self.engine.options.sync_kv_timeout_ms
        self.writes[receipt.transfer_id] = _PendingWrite(receipt, cache_id, time.monotonic() + timeout / 1000, link,
                                                         len(spec.blocks))
        return receipt.transfer_id

    async def serve_commit_write(self, session: bytes, transfer_id: int, timeout_ms: int) -> None:
        await self.commit_write_for(self.session_link(session), transfer_id, timeout_ms)

    async def commit_write_for(self, link: Link, transfer_id: int, timeout_ms: int) -> None:
        pw = self.writes.pop(transfer_id, None)
        if pw is None or pw.link is not link:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unknown transfer {transfer_id}")
        timeout = timeout_ms or self.engine.options.sync_kv_timeout_ms
        deadline = min(pw.deadline, time.monotonic() + timeout / 1000)
        with track_transfer(self.node.metrics, "serve_write", self.cluster_id, link.remote_cluster) as tracked:
            try:
                await self._in_thread(pw.receipt.wait, deadline)
                link.bytes_in += pw.receipt.expected
                tracked.done(pw.receipt.expected, pw.blocks)
            except DataDistError:
                pw.receipt.cancel()
                raise
            finally:
                self.engine.unpin(pw.cache_id)
