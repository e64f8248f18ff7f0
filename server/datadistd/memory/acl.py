"""Ascend device memory (``acl``): the production backend on Ascend NPUs.

Not implemented here, and it could not be verified: this machine has no Ascend NPU and no CANN
runtime. Constructing the backend imports CANN's ``acl`` Python bindings lazily and says plainly
what is missing. What it must do: allocate pools with ``aclrtMalloc`` (device) /
``aclrtMallocHost`` (host), export them to workers with ``aclrtIpcMemGetExportKey`` /
``aclrtIpcMemImportByKey``, and hand the transport device addresses for HCCL.
"""

from __future__ import annotations

from ..core.errors import DataDistError, StatusCode

__all__ = ["AclBackend"]


class AclBackend:
    name = "acl"

    def __init__(self, **_: object) -> None:
        try:
            import acl  # noqa: F401 - CANN's runtime bindings
        except ImportError:
            raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED,
                                "memory backend 'acl' needs Ascend CANN (the acl Python bindings), which is not "
                                "installed on this machine; use backend 'host'") from None
        raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED,
                            "memory backend 'acl' is not implemented in this build (no Ascend hardware to verify it)")
