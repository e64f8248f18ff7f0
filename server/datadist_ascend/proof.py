"""Proof that a worker handing NPU memory to its daemon by IPC key owns that memory.

An IPC key (``aclrtIpcMemGetExportKey``) is a name: ACL tells the importer nothing of who exported it, so
a worker that learned another worker's key could hand it over as its own, and its engine would then read
and write the other worker's NPU memory. So the worker proves it can *write* the memory behind the key:
before handing the key over it writes ``possession_proof(capability, key)`` -- an HMAC under the secret
capability of its own attach connection -- into the first ``PROOF_LEN`` bytes, and restores them after the
daemon answered; the daemon imports the key and reads those bytes before it accepts the memory. Another
worker's memory does not hold this worker's proof (it cannot write there, and cannot compute the other
worker's proof without that worker's capability). The daemon only reads the bytes, and tells no one what
it read.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["PROOF_LEN", "possession_proof"]

#: bytes of the proof, written at offset 0 of the memory behind the key
PROOF_LEN = 16
_LABEL = b"datadist npu memory possession v1\0"


def possession_proof(capability: bytes, key: str) -> bytes:
    """What the memory behind ``key`` holds at offset 0 while the worker with ``capability`` hands it over."""
    return hmac.new(capability, _LABEL + key.encode(), hashlib.sha256).digest()[:PROOF_LEN]
