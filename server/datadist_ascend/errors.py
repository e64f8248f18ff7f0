"""Which status a datadist caller sees for each ``aclError`` and ``HcclResult``: the one table.

CANN's LLM-DataDist maps HCCL results with ``CommUtils::ConvertCommErrorToStatus`` (PARA, TIMEOUT,
NOT_SUPPORT named; anything else the operation's default, e.g. ``LLM_LINK_FAILED`` while linking) and ACL
errors with ``ConvertAclError2Ge`` (stream sync timeout -> ``LLM_TIMEOUT``; any other code passed through
as a raw number). A raw ACL number is no ``LLMStatusCode``, so where CANN passes one through we name the
closest status below and keep the raw code in the message and in ``AscendError.code``.
"""

from __future__ import annotations

from datadist.status import LLMStatusCode

__all__ = ["AscendError", "AscendUnavailable", "ACL_STATUS", "HCCL_STATUS", "acl_status", "hccl_status",
           "ACL_NAMES", "HCCL_NAMES"]

#: aclError values (acl_base_rt.h, rt_error_codes.h) datadist names
ACL_NAMES = {
    0: "ACL_SUCCESS",
    100000: "ACL_ERROR_INVALID_PARAM",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    200000: "ACL_ERROR_BAD_ALLOC",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107023: "ACL_ERROR_RT_STREAM_ABORT",
    207000: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207006: "ACL_ERROR_RT_NO_PERMISSION",
    507000: "ACL_ERROR_RT_INTERNAL_ERROR",
    507046: "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
    507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
}

#: aclError -> status (anything not here: LLM_FAILED)
ACL_STATUS = {
    100000: LLMStatusCode.LLM_PARAM_INVALID,
    107000: LLMStatusCode.LLM_PARAM_INVALID,
    107001: LLMStatusCode.LLM_PARAM_INVALID,        # a device id this host does not have
    200000: LLMStatusCode.LLM_OUT_OF_MEMORY,
    207001: LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY, # "only used by out of memory" (the runtime's: device)
    207000: LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
    207006: LLMStatusCode.LLM_PARAM_INVALID,        # IPC import by a process not on the key's white list
    507046: LLMStatusCode.LLM_TIMEOUT,              # as ConvertAclError2Ge
}

#: HcclResult values (hccl_types.h)
HCCL_NAMES = {
    0: "HCCL_SUCCESS", 1: "HCCL_E_PARA", 2: "HCCL_E_PTR", 3: "HCCL_E_MEMORY", 4: "HCCL_E_INTERNAL",
    5: "HCCL_E_NOT_SUPPORT", 6: "HCCL_E_NOT_FOUND", 7: "HCCL_E_UNAVAIL", 8: "HCCL_E_SYSCALL", 9: "HCCL_E_TIMEOUT",
    10: "HCCL_E_OPEN_FILE_FAILURE", 11: "HCCL_E_TCP_CONNECT", 12: "HCCL_E_ROCE_CONNECT", 13: "HCCL_E_TCP_TRANSFER",
    14: "HCCL_E_ROCE_TRANSFER", 15: "HCCL_E_RUNTIME", 16: "HCCL_E_DRV", 17: "HCCL_E_PROFILING", 18: "HCCL_E_CCE",
    19: "HCCL_E_NETWORK", 20: "HCCL_E_AGAIN", 21: "HCCL_E_REMOTE", 22: "HCCL_E_SUSPENDING", 23: "HCCL_E_OPRETRY_FAIL",
}

#: HcclResult -> status, as CANN's ConvertCommErrorToStatus; anything else: the operation's default
HCCL_STATUS = {
    1: LLMStatusCode.LLM_PARAM_INVALID,
    9: LLMStatusCode.LLM_TIMEOUT,
    5: LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
}


def acl_status(code: int) -> LLMStatusCode:
    return ACL_STATUS.get(code, LLMStatusCode.LLM_FAILED)


def hccl_status(code: int, default: LLMStatusCode = LLMStatusCode.LLM_FAILED) -> LLMStatusCode:
    return HCCL_STATUS.get(code, default)


class AscendError(Exception):
    """A CANN call failed: ``func``, its raw ``code`` and the ``status`` a caller sees."""

    def __init__(self, func: str, code: int, status: LLMStatusCode, detail: str = "") -> None:
        self.func = func
        self.code = int(code)
        self.status = status
        name = (ACL_NAMES if func.startswith("acl") else HCCL_NAMES).get(self.code, "unknown code")
        super().__init__(f"{func} returned {self.code} ({name}){': ' + detail if detail else ''}")


class AscendUnavailable(AscendError):
    """CANN's libraries are not on this machine (``LLM_FEATURE_NOT_ENABLED``)."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.func = "dlopen"
        self.code = -1
        self.status = LLMStatusCode.LLM_FEATURE_NOT_ENABLED
