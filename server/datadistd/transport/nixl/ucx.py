"""NIXL and the UCX under it, as this process loads them: which package, which UCX settings by default (set before
UCX is loaded, each unless the operator set it), how long a transfer past its deadline may still end in the fabric
(``fence_seconds``), and the status a NIXL exception maps to."""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError

__all__ = ["load_api", "PACKAGE", "MODULES", "UCX_MODULES_DEFAULT", "UCX_TCP_USER_TIMEOUT_DEFAULT", "fence_seconds",
           "status_of", "ucx_transports"]

#: what to install, and the modules its wheels provide (the CUDA 12 wheel runs on CPU-only hosts too)
PACKAGE = "nixl-cu12"
MODULES = ("nixl_cu12", "nixl_cu13", "nixl")


#: UCX's module filter unless the operator set ``UCX_MODULES``: every module but UCX's EFA transport
#: (``libuct_ib_efa``). The NIXL wheel bundles its own libibverbs and libnl but not ``libefa.so.1``; on a host
#: with rdma-core's providers installed that module loads the system's libefa, and with it the system's
#: libibverbs and libnl beside the bundled copies. Two libnl-route copies in one process crash it in their
#: destructors at exit (SIGSEGV in ``rtnl_tc_unregister``). EFA is served by the LIBFABRIC backend
#: (docs/nixl.md, "A clean exit on RDMA hosts").
UCX_MODULES_DEFAULT = "^efa"


#: UCX's ``TCP_USER_TIMEOUT`` on its TCP connections unless the operator set ``UCX_TCP_USER_TIMEOUT``: the kernel
#: aborts a connection whose sent bytes stay unacknowledged that long. It is the only fence of a transfer given up in
#: flight: neither releasing a NIXL request (``ucp_request_cancel`` cancels tag receives only) nor unloading the
#: peer's agent (NIXL 1.5.1 closes the connection gracefully, after what it carries) stops a GET or PUT already
#: posted, and without it the kernel retransmits across a cut for ~15 minutes -- then delivers, when the network
#: heals, into memory the application reused. With it, a transfer past its deadline probes its connection
#: (``onesided.wire.PROBE``): a dead one leaves the probe unacknowledged and this side's kernel aborts it within this
#: long, which ends the transfer; only one still running a fence (``fence_seconds``) past its deadline may land
#: (docs/nixl.md, "Failure behaviour"). 3 s without one acknowledgement (or with the peer's window shut: a peer
#: process stalled that long) is an outage, not load; shorter cuts are ridden through as before.
UCX_TCP_USER_TIMEOUT_DEFAULT = "3s"

_UCX_TIME_UNITS = {"m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def fence_seconds(environ: dict[str, str] | None = None) -> float:
    """How long past its deadline a transfer is waited for before it is given up as one that may still land:
    ``UCX_TCP_USER_TIMEOUT`` (UCX's time syntax: a number and a unit of m, s, ms, us, ns), plus half a second for
    the peer's kernel timer; 0 when it bounds nothing (``inf``, ``auto``, unparsable)."""
    text = (os.environ if environ is None else environ).get("UCX_TCP_USER_TIMEOUT", "").strip().lower()
    if text[-1:].isdigit():
        text += "s"
    for unit in ("ms", "us", "ns", "m", "s"):
        if text.endswith(unit):
            try:
                seconds = float(text[:-len(unit)]) * _UCX_TIME_UNITS[unit]
            except ValueError:
                return 0.0
            return seconds + 0.5 if 0 < seconds < 3600 else 0.0
    return 0.0


def load_api() -> Any:
    """NIXL's Python API module (``nixl_agent`` & co.); ``LLM_FEATURE_NOT_ENABLED`` naming the package without it.

    Sets ``UCX_MODULES`` and ``UCX_TCP_USER_TIMEOUT`` (when unset) before UCX is loaded: see
    ``UCX_MODULES_DEFAULT`` and ``UCX_TCP_USER_TIMEOUT_DEFAULT``."""
    os.environ.setdefault("UCX_MODULES", UCX_MODULES_DEFAULT)
    os.environ.setdefault("UCX_TCP_USER_TIMEOUT", UCX_TCP_USER_TIMEOUT_DEFAULT)
    for name in MODULES:
        try:
            api = importlib.import_module(f"{name}._api")
        except ImportError:
            continue
        logging.getLogger("nixl").setLevel(logging.WARNING)    # its INFO lines say every agent and backend made
        return api
    raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                        f"the nixl transport needs NIXL: pip install --no-deps {PACKAGE} (or make nixl); "
                        f"none of the modules {', '.join(MODULES)} is importable")


#: NIXL's exception classes (``_bindings``) -> the status a caller sees
_STATUS = {
    "nixlInvalidParamError": LLMStatusCode.LLM_PARAM_INVALID,
    "nixlNotFoundError": LLMStatusCode.LLM_FAILED,          # a range the peer never registered / shipped
    "nixlMismatchError": LLMStatusCode.LLM_FAILED,
    "nixlNotAllowedError": LLMStatusCode.LLM_FAILED,
    "nixlNotSupportedError": LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
    "nixlBackendError": LLMStatusCode.LLM_LINK_FAILED,
    "nixlRemoteDisconnectError": LLMStatusCode.LLM_LINK_FAILED,
    "nixlCancelledError": LLMStatusCode.LLM_LINK_FAILED,
}


def status_of(exc: BaseException) -> LLMStatusCode:
    """The status table's code for an exception NIXL raised (``LLM_FAILED`` for any it does not name)."""
    return _STATUS.get(type(exc).__name__, LLMStatusCode.LLM_FAILED)


def ucx_transports() -> str:
    """The UCX transports this process may use, as UCX_TLS says (``auto``: UCX picks; shared memory and
    CMA on one host, RDMA verbs where a NIC is present, TCP otherwise)."""
    return os.environ.get("UCX_TLS", "") or "auto"
