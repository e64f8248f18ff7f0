"""Status codes and ``LLMException`` (CANN ``llm_datadist.status``).

``LLMStatusCode`` and ``code_2_status`` come from the one shared table in ``datadist.status``,
so daemon, wire and client agree on every name and number.
"""

from __future__ import annotations

from typing import Any, Tuple, Union

from datadist.status import LLMStatusCode, code_2_status

__all__ = ["LLMStatusCode", "LLMException", "Status", "code_2_status", "handle_llm_status"]


class LLMException(RuntimeError):
    """Error of an LLM-DataDist call; ``status_code`` tells which (an ``LLMStatusCode``)."""

    def __init__(self, *args: Any, status_code: LLMStatusCode = LLMStatusCode.LLM_SUCCESS) -> None:
        """An error of an LLM-DataDist call.

        Args:
            *args: the message (``RuntimeError``'s arguments).
            status_code: the ``LLMStatusCode`` saying which error.
        """
        super().__init__(*args)
        self._status_code = status_code

    @property
    def status_code(self) -> LLMStatusCode:
        """The ``LLMStatusCode`` of the error."""
        return self._status_code

    def __reduce__(self) -> Tuple[Any, ...]:
        # keep status_code across pickling (multiprocessing), which RuntimeError's default drops
        return (_rebuild_exception, (type(self), self.args, self._status_code))


def _rebuild_exception(cls: type, args: Tuple[Any, ...], status_code: LLMStatusCode) -> LLMException:
    return cls(*args, status_code=status_code)


class Status:
    """A numeric engine status: ``is_ok()`` and its ``LLMStatusCode`` (unknown numbers -> ``LLM_FAILED``)."""

    def __init__(self, status: Union[int, LLMStatusCode]) -> None:
        """A numeric engine status.

        Args:
            status: an ``LLMStatusCode`` or its number (unknown numbers become ``LLM_FAILED``).
        """
        self._status_code = code_2_status(status)

    def is_ok(self) -> bool:
        """Whether the status is ``LLM_SUCCESS``.

        Returns:
            True for success.
        """
        return self._status_code == LLMStatusCode.LLM_SUCCESS

    @property
    def status_code(self) -> LLMStatusCode:
        """The ``LLMStatusCode``."""
        return self._status_code

    def __repr__(self) -> str:
        return f"Status({self._status_code})"


def handle_llm_status(status_code: Union[int, LLMStatusCode], func_name: str, other_info: Any) -> None:
    """Raise ``LLMException`` with CANN's message when ``status_code`` is not success.

    Message: ``"{func_name} failed, error code is {LLMStatusCode.X}, {other_info}."``.
    """
    code = code_2_status(status_code)
    if code != LLMStatusCode.LLM_SUCCESS:
        raise LLMException(f"{func_name} failed, error code is {code}, {other_info}.", status_code=code)
