"""A decoder worker: links to a prompt worker, pulls blocks of its paged KV cache, checks every byte, pushes a
block back.

    DATADIST_DAEMON=unix:///run/datadist/datadistd.sock python decoder_worker.py \\
        --prompt 10.0.0.5:26000 --local-ip 10.0.0.6

``--prompt`` is the prompt worker's ``--listen`` address, ``--local-ip`` this host's address on the same
network. Both daemons need the same peer secret (docs/operations.md, "Two hosts"). Exit status 0 when every pulled byte
is what the prompt wrote and the pushed block arrived.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from prompt_worker import BLOCK_SHAPE, BLOCKS, DECODER_CLUSTER, LAYERS, MAILBOX, PROMPT_CLUSTER, block_bytes, pattern

import llm_datadist as ld


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default="127.0.0.1:26000", help="the prompt worker's listen ip:port")
    parser.add_argument("--local-ip", default="127.0.0.1", help="this host's address towards the prompt")
    parser.add_argument("--blocks", type=int, default=32, help="blocks to pull")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds to wait for the prompt worker's listener")
    args = parser.parse_args()
    prompt_ip, prompt_port = args.prompt.rsplit(":", 1)

    cfg = ld.LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    cfg.enable_remote_cache_accessible = True
    dd = ld.LLMDataDist(ld.LLMRole.DECODER, cluster_id=DECODER_CLUSTER)
    dd.init(cfg.generate_options())

    kv = [np.zeros((BLOCKS, *BLOCK_SHAPE), np.float16) for _ in range(2 * LAYERS)]
    desc = ld.CacheDesc(len(kv), list(kv[0].shape), ld.DataType.DT_FLOAT16)
    cache = dd.cache_manager.register_blocks_cache(desc, [t.ctypes.data for t in kv],
                                                   ld.BlocksCacheKey(DECODER_CLUSTER, 0))

    cluster = ld.LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER
    cluster.append_local_ip_info(args.local_ip, 0)
    cluster.append_remote_ip_info(prompt_ip, int(prompt_port))
    deadline = time.monotonic() + args.wait
    code, codes = dd.link_clusters([cluster], 5000)
    while code == ld.LLMStatusCode.LLM_LINK_FAILED and time.monotonic() < deadline:   # the prompt may be starting
        time.sleep(0.5)
        code, codes = dd.link_clusters([cluster], 5000)
    if code != ld.LLMStatusCode.LLM_SUCCESS:       # the reason is in this worker's log (a warning)
        print(f"decoder: link_clusters to {args.prompt} failed: {codes[0].name}", file=sys.stderr)
        return 1

    src = list(range(args.blocks))                 # the prompt's block table for this request ...
    dst = src[::-1]                                # ... lands in these blocks of ours
    t0 = time.perf_counter()                       # (the prompt listens only once its cache is registered)
    dd.cache_manager.pull_blocks(ld.BlocksCacheKey(PROMPT_CLUSTER, 0), cache, src, dst)
    ms = (time.perf_counter() - t0) * 1000
    wrong = sum(int(np.count_nonzero(block_bytes(t)[dst] != pattern(i, src, seed=1))) for i, t in enumerate(kv))
    mib = len(src) * len(kv) * kv[0][0].nbytes / 2**20
    print(f"decoder: pulled {len(src)} blocks x {len(kv)} tensors ({mib:.1f} MiB) in {ms:.1f} ms; "
          f"{wrong} bytes differ", flush=True)

    for i, t in enumerate(kv):                     # a block of ours goes back to the prompt's MAILBOX block
        block_bytes(t)[[0]] = pattern(i, [MAILBOX], seed=2)
    dd.cache_manager.push_blocks(ld.BlocksCacheKey(PROMPT_CLUSTER, 0), cache, [0], [MAILBOX])
    print(f"decoder: pushed block 0 into the prompt's block {MAILBOX}", flush=True)

    dd.unlink_clusters([cluster], 5000)
    dd.cache_manager.unregister_cache(cache.cache_id)
    dd.finalize()
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
