"""The messages one-sided links exchange in CONTROL_TRANSPORT frames of their tcp channel (see the package doc).

Each message is one letter, then its fields, little-endian:
"""

from __future__ import annotations

import struct

__all__ = ["META", "REFUSED", "MAX_REFUSAL", "DESCS", "FIN", "CANCEL", "NOTIF", "PROBE", "ID", "NOTIF_ID", "CODE",
           "META_HEAD", "MD_LEN"]

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
#: transfer for good (nothing lands after). The peer reads a READ's notification of no bytes (``tables.NOTIF_READ``)
PROBE = b"DDR" + bytes(16)
ID = struct.Struct("<cQ")
NOTIF_ID = struct.Struct("<3sQ")
CODE = struct.Struct("<q")
META_HEAD = struct.Struct("<cBH")
MD_LEN = struct.Struct("<I")
