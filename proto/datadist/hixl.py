"""CANN's HIXL engine API on the wire (docs/hixl.md): the facts the Python ``hixl`` client, the C++ ``hixl::Hixl``
and the daemon share -- HIXL's status codes and their mapping from the daemon's ``LLMStatusCode``, HIXL's notify
limits, and how an engine string ("ip", "ip:port", "[ipv6]", "[ipv6]:port") names an engine of the daemon (its
cluster id). The C++ library carries a copy of each (``client/cpp/src/hixl_wire.h``); ``tests/hixl`` checks both
against each other. Nothing here imports grpc.
"""

from __future__ import annotations

import ipaddress
import struct
from typing import NamedTuple

from .status import LLMStatusCode

__all__ = [
    "SUCCESS", "PARAM_INVALID", "TIMEOUT", "NOT_CONNECTED", "ALREADY_CONNECTED", "NOTIFY_FAILED", "UNSUPPORTED",
    "FAILED", "RESOURCE_EXHAUSTED", "MAX_NOTIFY_NAME_LEN", "MAX_NOTIFY_MSG_LEN", "MAX_NOTIFY_QUEUE", "EXTENT_SIZE",
    "Engine", "parse_engine", "engine_cluster_id", "hixl_status",
]

# HIXL's status codes (hicann/hixl include/hixl/hixl_types.h)
SUCCESS = 0
PARAM_INVALID = 103900
TIMEOUT = 103901
NOT_CONNECTED = 103902
ALREADY_CONNECTED = 103903
NOTIFY_FAILED = 103904
UNSUPPORTED = 103905
FAILED = 503900
RESOURCE_EXHAUSTED = 203900

# HIXL's notify limits (hicann/hixl src/hixl/common/ctrl_msg.h: kMaxNotifyNameLen, kMaxNotifyMsgLen,
# kMaxNotifyQueueSize): the sender refuses a longer name or message (PARAM_INVALID), the receiving engine a notify
# beyond its queue (RESOURCE_EXHAUSTED, hixl_server.cc ProcessNotifyMsg)
MAX_NOTIFY_NAME_LEN = 1024
MAX_NOTIFY_MSG_LEN = 1024
MAX_NOTIFY_QUEUE = 4096

#: bytes of one extent in ``ExtentTransferRequest.extents``: u64 local_addr, remote_addr, len (little-endian)
EXTENT_SIZE = 24

_S = LLMStatusCode
_MAP = {
    _S.LLM_SUCCESS: SUCCESS,
    _S.LLM_PARAM_INVALID: PARAM_INVALID,
    _S.LLM_KV_CACHE_NOT_EXIST: PARAM_INVALID,
    _S.LLM_TIMEOUT: TIMEOUT,
    _S.LLM_WAIT_PROCESS_TIMEOUT: TIMEOUT,
    _S.LLM_NOT_YET_LINK: NOT_CONNECTED,
    _S.LLM_ALREADY_LINK: ALREADY_CONNECTED,
    _S.LLM_EXIST_LINK: ALREADY_CONNECTED,
    _S.LLM_FEATURE_NOT_ENABLED: UNSUPPORTED,
    _S.LLM_OUT_OF_MEMORY: RESOURCE_EXHAUSTED,
    _S.LLM_DEVICE_OUT_OF_MEMORY: RESOURCE_EXHAUSTED,
    _S.LLM_BLOCKS_OUT_OF_MEMORY: RESOURCE_EXHAUSTED,
    _S.LLM_CLUSTER_NUM_EXCEED_LIMIT: RESOURCE_EXHAUSTED,
}


def hixl_status(code: int) -> int:
    """The HIXL status a daemon ``LLMStatusCode`` value stands for; every code not named here is ``FAILED``."""
    try:
        return _MAP.get(LLMStatusCode(int(code)), FAILED)
    except ValueError:
        return FAILED


class Engine(NamedTuple):
    """A parsed engine string: ``host`` (an IP address, IPv6 without brackets) and ``port`` (0: none -- the engine
    only connects out; > 0: it listens there, as HIXL's server end)."""

    host: str
    port: int

    @property
    def canonical(self) -> str:
        """"ip", "ip:port", "[ipv6]" or "[ipv6]:port": the form whose hash is the engine's cluster id."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.port else host


def parse_engine(text: str) -> Engine:
    """``text`` as HIXL takes a local or remote engine (hixl.h: "host_ip:host_port" or "host_ip", IPv6 as
    "[host_ip]:host_port" or "[host_ip]"); ValueError saying what is accepted otherwise. The host must be an IP
    address (HIXL's engines are named by address, not by host name); a port must be 0..65535, and port 0 is no
    port (HIXL's ParseListenInfo reads "ip:0" as an engine that does not listen: canonically "ip")."""
    if not isinstance(text, str) or not text or text != text.strip():
        raise ValueError(f"engine {text!r}: expected 'ip', 'ip:port', '[ipv6]' or '[ipv6]:port'")
    port_text = ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (end + 1 < len(text) and text[end + 1] != ":"):
            raise ValueError(f"engine {text!r}: an IPv6 engine is '[ipv6]' or '[ipv6]:port'")
        host, port_text = text[1:end], text[end + 2:] if end + 1 < len(text) else ""
        if end + 1 < len(text) and not port_text:
            raise ValueError(f"engine {text!r}: no port after ':'")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        if not port_text:
            raise ValueError(f"engine {text!r}: no port after ':'")
    else:
        host = text
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"engine {text!r}: {host!r} is not an IP address") from None
    if addr.version == 6 and not text.startswith("["):
        raise ValueError(f"engine {text!r}: write an IPv6 engine as '[{host}]' or '[{host}]:port'")
    port = 0
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            raise ValueError(f"engine {text!r}: port {port_text!r} is not in 0..65535")
        port = int(port_text)
    host = _v6_text(addr) if isinstance(addr, ipaddress.IPv6Address) else str(addr)
    return Engine(host, port)


def _v6_text(addr: ipaddress.IPv6Address) -> str:
    """An IPv6 address as the canonical form spells it, whatever Python's ``str`` does (3.13 prints an IPv4-mapped
    address dotted, 3.11 in hextets): lowercase hextets without leading zeros, the longest run of two or more zero
    hextets (the first of equal ones) as "::", a "%scope" kept as given. The C++ copy spells it the same."""
    h = struct.unpack(">8H", addr.packed)
    best, best_len, i = -1, 0, 0
    while i < 8:
        j = i
        while j < 8 and h[j] == 0:
            j += 1
        if j - i > best_len:
            best, best_len = i, j - i
        i = j + 1 if j == i else j
    parts = [f"{x:x}" for x in h]
    if best_len >= 2:
        text = ":".join(parts[:best]) + "::" + ":".join(parts[best + best_len:])
    else:
        text = ":".join(parts)
    return text + (f"%{addr.scope_id}" if addr.scope_id else "")


_FNV_OFFSET, _FNV_PRIME, _MASK63 = 0xCBF29CE484222325, 0x100000001B3, (1 << 63) - 1


def engine_cluster_id(engine: Engine) -> int:
    """The cluster id of the daemon engine a HIXL engine is: FNV-1a 64 of its canonical string, top bit cleared
    (HIXL links by engine string, the daemon by cluster id; both ends compute the same id from the same string, so
    ``Connect("ip:port")`` links to the cluster the listening engine took). The C++ library computes the same."""
    h = _FNV_OFFSET
    for byte in engine.canonical.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return (h & _MASK63) or 1
