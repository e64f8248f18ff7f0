"""The one status table of datadist.

``LLMStatusCode`` keeps CANN's names and numeric values (``ge::Status`` numbers,
``0x5010B000 + n`` for the LLM codes). The daemon raises errors carrying one of these,
the gRPC layer puts the exact number on the wire, and the client raises
``LLMException(status_code=...)`` with the same member. Nothing here imports grpc.
"""

from __future__ import annotations

import enum

__all__ = ["LLMStatusCode", "code_2_status", "STATUS_METADATA_KEY", "ERROR_DOMAIN"]

#: trailing-metadata key that carries the numeric status code of a failed call
STATUS_METADATA_KEY = "datadist-status-code"
#: ``google.rpc.ErrorInfo.domain`` used in rich error details
ERROR_DOMAIN = "datadist.v1"

_BASE = 0x5010B000


class LLMStatusCode(enum.IntEnum):
    """Status codes of LLM-DataDist, names and values exactly as CANN's ``llm_datadist.LLMStatusCode``."""

    LLM_SUCCESS = 0
    LLM_FAILED = 0xFFFFFFFF
    LLM_WAIT_PROCESS_TIMEOUT = _BASE + 0x01
    LLM_KV_CACHE_NOT_EXIST = _BASE + 0x02
    LLM_REPEAT_REQUEST = _BASE + 0x03
    LLM_REQUEST_ALREADY_COMPLETED = _BASE + 0x04
    LLM_PARAM_INVALID = _BASE + 0x05
    LLM_ENGINE_FINALIZED = _BASE + 0x06
    LLM_NOT_YET_LINK = _BASE + 0x07
    LLM_ALREADY_LINK = _BASE + 0x08
    LLM_LINK_FAILED = _BASE + 0x09
    LLM_UNLINK_FAILED = _BASE + 0x0A
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = _BASE + 0x0B
    LLM_CLUSTER_NUM_EXCEED_LIMIT = _BASE + 0x0C
    LLM_PROCESSING_LINK = _BASE + 0x0D
    LLM_DEVICE_OUT_OF_MEMORY = _BASE + 0x0E
    LLM_PREFIX_ALREADY_EXIST = _BASE + 0x0F
    LLM_PREFIX_NOT_EXIST = _BASE + 0x10
    LLM_SEQ_LENOVERLIMIT = _BASE + 0x11  # sic: CANN spells it without the underscore
    LLM_NO_FREE_BLOCK = _BASE + 0x12
    LLM_BLOCKS_OUT_OF_MEMORY = _BASE + 0x13
    LLM_EXIST_LINK = _BASE + 0x18
    LLM_FEATURE_NOT_ENABLED = _BASE + 0x19
    LLM_TIMEOUT = _BASE + 0x1A
    LLM_LINK_BUSY = _BASE + 0x1B
    LLM_OUT_OF_MEMORY = _BASE + 0x1C
    LLM_DEVICE_MEM_ERROR = 507053
    LLM_SUSPECT_REMOTE_ERROR = 507057
    LLM_UNKNOWN_ERROR = -1

    def __str__(self) -> str:  # CANN prints "LLMStatusCode.LLM_X"
        return f"LLMStatusCode.{self.name}"


_BY_VALUE = {int(m): m for m in LLMStatusCode}


def code_2_status(code: int) -> LLMStatusCode:
    """Map a numeric engine code to its member; unknown numbers map to ``LLM_FAILED`` (CANN's rule)."""
    return _BY_VALUE.get(int(code), LLMStatusCode.LLM_FAILED)
