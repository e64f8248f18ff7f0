"""One error mapping: ``DataDistError(code)`` -> gRPC status carrying the exact ``LLMStatusCode``.

The numeric code travels in trailing metadata (``datadist-status-code``) and in a
``google.rpc.Status`` with an ``ErrorInfo`` (reason = the code's name), so grpcurl shows it too.
``StatusCode`` of gRPC is chosen by the code's meaning, never INTERNAL for a known failure.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from datadist.status import ERROR_DOMAIN, STATUS_METADATA_KEY, LLMStatusCode

from ...core.errors import DataDistError
from ...ops.metrics import count_error

if TYPE_CHECKING:
    from ...ops.metrics import DaemonMetrics

__all__ = ["GRPC_CODE", "grpc_code", "error_trailers", "guarded", "error_from_rpc", "abort_with"]

log = logging.getLogger(__name__)

S = LLMStatusCode
G = grpc.StatusCode

GRPC_CODE: dict[LLMStatusCode, grpc.StatusCode] = {
    S.LLM_PARAM_INVALID: G.INVALID_ARGUMENT,
    S.LLM_CLUSTER_NUM_EXCEED_LIMIT: G.INVALID_ARGUMENT,
    S.LLM_SEQ_LENOVERLIMIT: G.INVALID_ARGUMENT,
    S.LLM_KV_CACHE_NOT_EXIST: G.NOT_FOUND,
    S.LLM_PREFIX_NOT_EXIST: G.NOT_FOUND,
    S.LLM_ALREADY_LINK: G.ALREADY_EXISTS,
    S.LLM_PREFIX_ALREADY_EXIST: G.ALREADY_EXISTS,
    S.LLM_REPEAT_REQUEST: G.ALREADY_EXISTS,
    S.LLM_REQUEST_ALREADY_COMPLETED: G.FAILED_PRECONDITION,
    S.LLM_NOT_YET_LINK: G.FAILED_PRECONDITION,
    S.LLM_EXIST_LINK: G.FAILED_PRECONDITION,
    S.LLM_ENGINE_FINALIZED: G.FAILED_PRECONDITION,
    S.LLM_FEATURE_NOT_ENABLED: G.FAILED_PRECONDITION,
    S.LLM_TIMEOUT: G.DEADLINE_EXCEEDED,
    S.LLM_WAIT_PROCESS_TIMEOUT: G.DEADLINE_EXCEEDED,
    S.LLM_OUT_OF_MEMORY: G.RESOURCE_EXHAUSTED,
    S.LLM_DEVICE_OUT_OF_MEMORY: G.RESOURCE_EXHAUSTED,
    S.LLM_BLOCKS_OUT_OF_MEMORY: G.RESOURCE_EXHAUSTED,
    S.LLM_NO_FREE_BLOCK: G.RESOURCE_EXHAUSTED,
    S.LLM_LINK_BUSY: G.ABORTED,
    S.LLM_PROCESSING_LINK: G.ABORTED,
    S.LLM_LINK_FAILED: G.UNAVAILABLE,
    S.LLM_UNLINK_FAILED: G.UNAVAILABLE,
    S.LLM_NOTIFY_PROMPT_UNLINK_FAILED: G.UNAVAILABLE,
    S.LLM_SUSPECT_REMOTE_ERROR: G.UNAVAILABLE,
    S.LLM_DEVICE_MEM_ERROR: G.DATA_LOSS,
    S.LLM_FAILED: G.INTERNAL,
    S.LLM_UNKNOWN_ERROR: G.UNKNOWN,
}


def grpc_code(code: LLMStatusCode) -> grpc.StatusCode:
    return GRPC_CODE.get(code, G.INTERNAL)


def error_trailers(code: LLMStatusCode, message: str) -> tuple[tuple[str, Any], ...]:
    info = error_details_pb2.ErrorInfo(reason=code.name, domain=ERROR_DOMAIN, metadata={"status_code": str(int(code))})
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=grpc_code(code).value[0], message=message, details=[detail])
    return ((STATUS_METADATA_KEY, str(int(code))), ("grpc-status-details-bin", status.SerializeToString()))


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


async def abort_with(context: grpc.aio.ServicerContext, exc: DataDistError) -> None:
    """End the call with ``exc``: its LLMStatusCode in the trailers, the matching gRPC code and message."""
    context.set_trailing_metadata(error_trailers(exc.code, exc.message))
    await context.abort(grpc_code(exc.code), exc.message)


class Counted(Protocol):
    """A servicer whose failures ``guarded`` counts."""

    metrics: DaemonMetrics | None


def guarded(fn: F) -> F:
    """Servicer method wrapper: ``DataDistError`` -> its status; anything else -> INTERNAL/LLM_FAILED, logged.

    Every failure is also counted by method and status code name in the servicer's ``metrics``
    (``Counted``: every servicer has the attribute, ``None`` when the daemon keeps no metrics).
    """

    @functools.wraps(fn)
    async def wrapper(self: Counted, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except DataDistError as exc:
            count_error(self.metrics, fn.__name__, exc.code)
            await abort_with(context, exc)
        except (grpc.aio.AbortError, grpc.RpcError):  # already aborted / propagated
            raise
        except Exception as exc:  # a bug: say so, keep serving
            log.exception("%s failed unexpectedly", fn.__name__)
            count_error(self.metrics, fn.__name__, LLMStatusCode.LLM_FAILED)
            message = f"internal error in {fn.__name__}: {type(exc).__name__}: {exc}"
            context.set_trailing_metadata(error_trailers(LLMStatusCode.LLM_FAILED, message))
            await context.abort(G.INTERNAL, message)

    return wrapper  # type: ignore[return-value]


def error_from_rpc(err: grpc.RpcError, what: str) -> DataDistError:
    """A failed call on a peer daemon -> ``DataDistError`` with the peer's code (or a transport-level one)."""
    code = None
    for key, value in (err.trailing_metadata() or ()):
        if key == STATUS_METADATA_KEY:
            try:
                code = LLMStatusCode(int(value))
            except ValueError:
                code = LLMStatusCode.LLM_FAILED
    details = err.details() or ""
    if code is not None:
        return DataDistError(code, details)
    status = err.code()
    if status == G.DEADLINE_EXCEEDED:
        return DataDistError(LLMStatusCode.LLM_TIMEOUT, f"{what}: deadline exceeded")
    if status in (G.UNAVAILABLE, G.CANCELLED):
        return DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{what}: peer unreachable ({details})")
    return DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{what}: {status.name} {details}")
