"""``CacheTask``: the handle of a layer-wise asynchronous transfer (CANN §5.7)."""

from __future__ import annotations

import threading
from typing import List, Optional

from .status import LLMStatusCode


class CacheTask:
    """Results per transfer config; ``None`` for configs whose layers were never sent."""

    def __init__(self, num_configs: int, default_error: LLMStatusCode = LLMStatusCode.LLM_TIMEOUT) -> None:
        """Made by ``transfer_cache_async``, not by users.

        Args:
            num_configs: how many transfer configs the task has (one result each).
            default_error: what a wait that times out answers.
        """
        self._results: List[Optional[LLMStatusCode]] = [None] * num_configs
        self._done = threading.Event()
        self._default_error = default_error
        self._lock = threading.Lock()

    # producer side (the transfer thread)
    def _set_result(self, index: int, code: LLMStatusCode) -> None:
        with self._lock:
            if self._results[index] in (None, LLMStatusCode.LLM_SUCCESS):
                self._results[index] = code

    def _finish(self) -> None:
        self._done.set()

    def _wait(self, timeout_in_millis: Optional[int]) -> bool:
        return self._done.wait(None if timeout_in_millis is None else timeout_in_millis / 1000)

    def synchronize(self, timeout_in_millis: Optional[int] = None) -> LLMStatusCode:
        """Wait for the transfer to end.

        Args:
            timeout_in_millis: how long to wait (None: until it ends).

        Returns:
            The first failed config's ``LLMStatusCode``, else ``LLM_SUCCESS``; the task's default error
            (``LLM_TIMEOUT``, v1 ``LLM_WAIT_PROCESS_TIMEOUT``) when it did not end in time.

        Raises:
            Nothing: failures are the returned code.
        """
        if not self._wait(timeout_in_millis):
            return self._default_error
        with self._lock:
            for code in self._results:
                if code is not None and code != LLMStatusCode.LLM_SUCCESS:
                    return code
        return LLMStatusCode.LLM_SUCCESS

    def get_results(self, timeout_in_millis: Optional[int] = None) -> List[Optional[LLMStatusCode]]:
        """Wait for the transfer to end and give each config's result.

        Args:
            timeout_in_millis: how long to wait (None: until it ends).

        Returns:
            One ``LLMStatusCode`` per transfer config, in order (None for a config whose layers were never sent); the
            default error for every config when the task did not end in time.

        Raises:
            Nothing: failures are the returned codes.
        """
        if not self._wait(timeout_in_millis):
            return [self._default_error] * len(self._results)
        with self._lock:
            return list(self._results)
