"""The ``hccl`` transport (Ascend HCCL): registered by name, not implemented in this build.

Importing this module never fails. Constructing ``HcclTransport`` looks for the HCCL Python bindings
that come with Ascend CANN; they are absent here, so it raises ``LLM_FEATURE_NOT_ENABLED``. Even where
they exist, this build has no HCCL data plane that was ever run against real hardware, so it refuses
rather than pretend.
"""

from __future__ import annotations

import importlib

from datadist.status import LLMStatusCode

from ..core.errors import DataDistError

__all__ = ["HcclTransport"]

_MODULES = ("hccl",)  # CANN installs the ``hccl`` package (hccl.manage.api, ...) with the toolkit


def _find_bindings() -> str | None:
    for name in _MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - ImportError, or a broken install failing at import time
            continue
        return name
    return None


class HcclTransport:
    name = "hccl"
    label = "hccl"

    def __init__(self, **_settings: object) -> None:
        found = _find_bindings()
        if found is None:
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                "hccl transport needs Ascend CANN (hccl) which is not installed on this machine; "
                                "it cannot be verified here")
        raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                            f"Ascend HCCL bindings ({found}) are installed, but this build of datadist has no "
                            f"HCCL data plane; use transport 'tcp'")
