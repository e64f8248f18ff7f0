"""The HIXL notifies an engine received (``SendNotify`` of a linked engine; ``GetNotifies`` takes them): in order,
bounded as HIXL bounds them (``datadist.hixl``: a name or message over 1,024 bytes is refused, ``LLM_PARAM_INVALID``;
a notify beyond 4,096 queued, ``LLM_OUT_OF_MEMORY`` -- HIXL's RESOURCE_EXHAUSTED -- with nothing queued). The event
loop's, as the rest of the engine."""

from __future__ import annotations

from collections import deque

from datadist.hixl import MAX_NOTIFY_MSG_LEN, MAX_NOTIFY_NAME_LEN, MAX_NOTIFY_QUEUE

from ..core.errors import DataDistError, StatusCode

__all__ = ["Notifies", "check_notify"]


def check_notify(name: bytes, msg: bytes) -> None:
    """HIXL's bounds of one notify (hixl_client.cc ``SendNotify``, hixl_server.cc ``ProcessNotifyMsg``)."""
    if len(name) > MAX_NOTIFY_NAME_LEN:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"notify name of {len(name)} bytes; at most {MAX_NOTIFY_NAME_LEN}")
    if len(msg) > MAX_NOTIFY_MSG_LEN:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"notify message of {len(msg)} bytes; at most {MAX_NOTIFY_MSG_LEN}")


class Notifies:
    """One engine's received notifies, oldest first."""

    def __init__(self, most: int = MAX_NOTIFY_QUEUE) -> None:
        self.most = most
        self._queue: deque[tuple[bytes, bytes]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, name: bytes, msg: bytes, sender: int) -> None:
        """Queue a notify from cluster ``sender``; refused (nothing queued) past HIXL's bounds."""
        check_notify(name, msg)
        if len(self._queue) >= self.most:
            raise DataDistError(StatusCode.LLM_OUT_OF_MEMORY,
                                f"the notify queue of the receiving engine is full ({self.most} notifies not yet "
                                f"taken by GetNotifies); cluster {sender}'s notify was not queued")
        self._queue.append((name, msg))

    def take(self) -> list[tuple[bytes, bytes]]:
        """Every queued notify, oldest first; the queue is empty after."""
        out = list(self._queue)
        self._queue.clear()
        return out
