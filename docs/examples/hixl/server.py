"""A HIXL server: a listening engine whose host buffer a client reads, writes back into, then says "done" to.

    DATADIST_DAEMON=unix:///run/datadist/datadistd.sock python server.py 10.0.0.5:16001

Once its buffer is registered it prints one line ending in the client's two arguments, its engine string and the
buffer's address:

    server: ready; run the client with: 10.0.0.5:16001 0x7f3c5a000000

then waits (at most --timeout seconds) for the client's "done" notify, checks that the client's WRITE arrived,
deregisters the buffer and finalizes. Without DATADIST_DAEMON the engine runs on a daemon embedded in the process;
clients on other hosts need the cluster's peer secret in both daemons' configs (docs/operations.md, "Two hosts").
Exit status 0 when every step succeeded; otherwise 1, with the failing call's status named.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import hixl

BUF_SIZE = 1 << 20                 # the server's buffer: 1 MiB of host memory ...
BLOCK = 4096                       # ... that the client moves in extents of 4 KiB
BLOCKS = BUF_SIZE // BLOCK
STATUS_NAMES = {getattr(hixl, name): name for name in (
    "SUCCESS", "PARAM_INVALID", "TIMEOUT", "NOT_CONNECTED", "ALREADY_CONNECTED", "NOTIFY_FAILED", "UNSUPPORTED",
    "FAILED", "RESOURCE_EXHAUSTED")}


def pattern(size: int) -> np.ndarray:
    """What the server's buffer holds: byte i is i mod 251 (a prime: no two blocks are alike)."""
    return (np.arange(size) % 251).astype(np.uint8)


def check(who: str, ret: int, what: str) -> None:
    """Print ``what`` with the status it returned; exit with status 1 unless it is SUCCESS."""
    name = STATUS_NAMES.get(ret, str(ret))
    if ret != hixl.SUCCESS:
        print(f"{who}: {what} failed: {name}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    print(f"{who}: {what}: {name}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", help="ip:port to listen at; clients connect to exactly this string")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the client's notify")
    args = parser.parse_args()

    engine = hixl.Hixl()
    try:
        check("server", engine.initialize(args.engine, {}), f"initialize {args.engine}")   # a port: it listens
        buf = pattern(BUF_SIZE)    # host memory; with NPUs, NPU memory registered as MEM_DEVICE
        ret, handle = engine.register_mem(hixl.MemDesc(buf.ctypes.data, buf.nbytes), hixl.MemType.MEM_HOST)
        check("server", ret, f"register_mem of {buf.nbytes} bytes")
        print(f"server: ready; run the client with: {args.engine} {buf.ctypes.data:#x}", flush=True)

        deadline = time.monotonic() + args.timeout    # the client's notify, polled for at most --timeout s
        ret, notifies = engine.get_notifies()
        while ret == hixl.SUCCESS and not notifies and time.monotonic() < deadline:
            time.sleep(0.05)
            ret, notifies = engine.get_notifies()
        check("server", ret, "get_notifies")
        if not notifies or notifies[0].name != "done":
            print(f"server: no \"done\" notify within {args.timeout:.0f} s: {notifies}", file=sys.stderr)
            return 1
        print(f"server: notify {notifies[0].name!r}: {notifies[0].notify_msg!r}", flush=True)
        wrong = int(np.count_nonzero(buf != pattern(BUF_SIZE) ^ 0xFF))
        print(f"server: checked the client's WRITE: {wrong} bytes differ", flush=True)
        check("server", engine.deregister_mem(handle), "deregister_mem")
        return 1 if wrong else 0
    finally:
        engine.finalize()
        print("server: finalized", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
