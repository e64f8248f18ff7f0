"""The messages one-sided links exchange in CONTROL_TRANSPORT frames of their tcp channel (see the package doc).

Each message is one letter, then its fields, little-endian:
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["META", "REFUSED", "MAX_REFUSAL", "DESCS", "FIN", "CANCEL", "NOTIF", "PROBE", "ID", "NOTIF_ID", "CODE",
           "META_HEAD", "MD_LEN", "PUBLISH", "PUBLISH_HEAD", "WITHDRAW", "NOTIF_READ",
           "parse_publish"]

META = b"M"      # u8 reply wanted, u16 name length, agent name, agent metadata
REFUSED = b"R"   # UTF-8 text (at most MAX_REFUSAL bytes): why this side refused the peer's META; the channel closes
MAX_REFUSAL = 1024
DESCS = b"D"     # u64 transfer id, u32 metadata length, partial metadata, then extents (u64 address, u64 length)
FIN = b"F"       # u64 transfer id, i64 status code: the sender failed and wrote nothing that can still land
CANCEL = b"X"    # u64 transfer id: the receiver gave up; answered by FIN (nothing was posted) or by the
                 # NIXL notification of the WRITE (it was posted: it completes, and the notification says so)
NOTIF = b"DDN"   # NIXL notification of a WRITE, delivered after its bytes: this, u64 transfer id
#: NIXL notification a transfer past its deadline sends its peer, on the fabric's own connection: unacknowledged on a
#: dead connection, it makes this side's kernel abort that connection within UCX_TCP_USER_TIMEOUT, which ends the
#: transfer for good (nothing lands after). The peer reads a READ's notification of no bytes (``NOTIF_READ``)
PROBE = b"DDR" + bytes(16)
ID = struct.Struct("<cQ")
NOTIF_ID = struct.Struct("<3sQ")
CODE = struct.Struct("<q")
META_HEAD = struct.Struct("<cBH")
MD_LEN = struct.Struct("<I")
#: published tables (``tables``): u64 handle, u64 generation, u64 row size, u32 rows, u32 tensors, then the tensors'
#: addresses (u64 each), u32 metadata length, metadata, u32 info length, info
PUBLISH = b"P"
PUBLISH_HEAD = struct.Struct("<cQQQII")
WITHDRAW = b"W"   # u64 handle (``ID``)
NOTIF_READ = struct.Struct("<3sQQ")   # b"DDR", handle, bytes: a READ of published rows ended (to the owner)


def parse_publish(payload: bytes) -> tuple[int, int, int, int, np.ndarray, bytes, bytes]:
    """A ``P`` message: its handle, generation, row size, rows, the tensors' addresses, metadata and info. Raises
    ``ValueError`` (``struct.error``: its head) when it is cut short or has bytes left over; what it may hold is
    bounded by the reader (``tables``)."""
    _, handle, generation, row_size, rows, count = PUBLISH_HEAD.unpack_from(payload)
    at = PUBLISH_HEAD.size + 8 * count
    bases = np.frombuffer(payload, dtype="<u8", count=count, offset=PUBLISH_HEAD.size).astype(np.uint64)
    (md_len,) = MD_LEN.unpack_from(payload, at)
    metadata = payload[at + MD_LEN.size:at + MD_LEN.size + md_len]
    at += MD_LEN.size + md_len
    (info_len,) = MD_LEN.unpack_from(payload, at)
    info = payload[at + MD_LEN.size:at + MD_LEN.size + info_len]
    if len(metadata) != md_len or len(info) != info_len or at + MD_LEN.size + info_len != len(payload):
        raise ValueError("a truncated P message")
    return handle, generation, row_size, rows, bases, bytes(metadata), bytes(info)
