"""``DataDistError``: the single exception type the daemon raises for a failed operation."""

from __future__ import annotations

from datadist.status import LLMStatusCode

__all__ = ["DataDistError", "StatusCode", "require"]

StatusCode = LLMStatusCode


class DataDistError(Exception):
    """A failure with one of CANN's status codes; the gRPC layer carries ``code`` end to end."""

    def __init__(self, code: LLMStatusCode, message: str = "", retryable: bool = False) -> None:
        super().__init__(message or code.name)
        self.code = LLMStatusCode(code)
        self.message = message or code.name
        #: a peer's admission turned the attempt away ("retry later"): the same attempt may succeed a moment
        #: later, within its deadline
        self.retryable = retryable

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def require(condition: bool, message: str, code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID) -> None:
    """Raise ``DataDistError(code, message)`` unless ``condition`` holds (use instead of ``assert``)."""
    if not condition:
        raise DataDistError(code, message)
