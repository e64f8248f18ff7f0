"""ctypes bindings of CANN's C runtime (``libascendcl.so``) and HCCL (``libhccl.so`` / ``libhcomm.so``), shared
by the daemon (``acl`` memory backend, ``hccl`` transport) and the worker library (importing the daemon's
device pools, exporting its own NPU tensors).

Libraries are found with ``dlopen``: ``$ASCEND_HOME_PATH/lib64`` first, then the loader's own search
(``LD_LIBRARY_PATH``, ``ldconfig``). Missing ones raise ``AscendUnavailable`` (``LLM_FEATURE_NOT_ENABLED``)
naming every place looked at. Every call's return code is checked; a failure raises ``AscendError`` whose
``status`` comes from the one table in ``errors.py`` (docs/ascend.md prints it).

Prototypes, constants and struct layouts are those of CANN's public headers (``acl/acl_rt.h``,
``acl/acl_base_rt.h``, ``acl/error_codes/rt_error_codes.h``, ``hccl/hccl_types.h``; the one-sided
HCCL types of LLM-DataDist's ``comm_adapter/comm_types.h`` and hcomm's ``hcomm_res_defs.h``). Tests run
them against a simulated runtime (``tests/sim``); ``make test-ascend`` against real libraries.
"""

from .errors import ACL_STATUS, HCCL_STATUS, AscendError, AscendUnavailable, acl_status, hccl_status
from .loader import find_library

__all__ = ["AscendError", "AscendUnavailable", "ACL_STATUS", "HCCL_STATUS", "acl_status", "hccl_status",
           "find_library"]
