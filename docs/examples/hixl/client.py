"""A HIXL client: connects to server.py's engine, READs its buffer in 256 extents, checks every byte, WRITEs the
bytes back inverted (asynchronously), tells the server "done" with a notify, and disconnects.

    DATADIST_DAEMON=unix:///run/datadist/datadistd.sock python client.py 10.0.0.5:16001 0x7f3c5a000000 \\
        --local-engine 10.0.0.6

The two arguments are the ones the server printed: its engine string and its buffer's address. ``--local-engine``
is this host's address on the same network; it names no port, so this engine only connects out. Exit status 0 when
every byte read is the server's and every step succeeded; otherwise 1, with the failing call's status named.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import hixl
from server import BLOCK, BLOCKS, BUF_SIZE, check, pattern


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server", help="the server's engine string, as it printed it")
    parser.add_argument("addr", type=lambda text: int(text, 0), help="the server's buffer address, as it printed it")
    parser.add_argument("--local-engine", default="127.0.0.1", help="this host's ip towards the server")
    args = parser.parse_args()

    engine = hixl.Hixl()
    try:
        check("client", engine.initialize(args.local_engine, {}), f"initialize {args.local_engine}")
        buf = np.zeros(BUF_SIZE, np.uint8)
        ret, handle = engine.register_mem(hixl.MemDesc(buf.ctypes.data, buf.nbytes), hixl.MemType.MEM_HOST)
        check("client", ret, f"register_mem of {buf.nbytes} bytes")
        check("client", engine.connect(args.server, timeout_in_millis=5000), f"connect {args.server}")

        # block i of the server's buffer <-> block BLOCKS-1-i of ours: any pairing of extents is one transfer
        descs = [hixl.TransferOpDesc(buf.ctypes.data + (BLOCKS - 1 - i) * BLOCK, args.addr + i * BLOCK, BLOCK)
                 for i in range(BLOCKS)]
        t0 = time.perf_counter()
        ret = engine.transfer_sync(args.server, hixl.TransferOp.READ, descs, timeout_in_millis=10000)
        check("client", ret, f"transfer_sync READ of {len(descs)} extents")
        ms = (time.perf_counter() - t0) * 1000
        wrong = int(np.count_nonzero(buf.reshape(BLOCKS, BLOCK)[::-1] != pattern(BUF_SIZE).reshape(BLOCKS, BLOCK)))
        print(f"client: read {buf.nbytes} bytes in {ms:.1f} ms; {wrong} bytes differ", flush=True)
        if wrong:
            return 1

        buf ^= 0xFF                # our answer: every byte inverted, written back to where it came from
        ret, req = engine.transfer_async(args.server, hixl.TransferOp.WRITE, descs)
        check("client", ret, f"transfer_async WRITE of {len(descs)} extents")
        deadline = time.monotonic() + 30   # polled until it finishes (a finished request is reported once)
        ret, status = engine.get_transfer_status(req)
        while ret == hixl.SUCCESS and status == hixl.TransferStatus.WAITING and time.monotonic() < deadline:
            time.sleep(0.001)
            ret, status = engine.get_transfer_status(req)
        check("client", ret, "get_transfer_status")
        print(f"client: the WRITE is {status.name}", flush=True)
        if status != hixl.TransferStatus.COMPLETED:
            return 1

        notify = hixl.NotifyDesc("done", f"wrote {buf.nbytes} bytes")   # the server waits for this
        check("client", engine.send_notify(args.server, notify, timeout_in_millis=5000), "send_notify done")
        check("client", engine.disconnect(args.server, timeout_in_millis=5000), "disconnect")
        check("client", engine.deregister_mem(handle), "deregister_mem")   # after disconnect, as HIXL requires
        return 0
    finally:
        engine.finalize()
        print("client: finalized", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
