"""A prompt (prefill) worker: registers its paged KV cache, fills it, and serves it to decoder workers.

Through a daemon (the production shape; one ``datadistd`` per node, see README "Run the daemon"):

    DATADIST_DAEMON=unix:///run/datadist/datadistd.sock python prompt_worker.py --listen 10.0.0.5:26000

Without ``DATADIST_DAEMON`` the worker starts an embedded daemon inside itself. A listen address other hosts
can reach needs the cluster's peer secret in the daemon's config (``[peer] secret_file``; embedded: the
``DATADISTD_PEER_SECRET_FILE`` variable); loopback works without one. It registers its cache before it
listens (``switch_role`` with ``llm.listenIpInfo``), so a decoder never links before there is something to pull.
The worker serves until a decoder pushed a block back into its cache (``decoder_worker.py``) or ``--timeout``
seconds passed.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import llm_datadist as ld

PROMPT_CLUSTER, DECODER_CLUSTER = 1, 2
LAYERS, BLOCKS, BLOCK_SHAPE = 4, 64, (16, 8, 64)   # 4 layers x (K, V); 64 blocks of 16 tokens x 8 heads x 64
MAILBOX = BLOCKS - 1                               # the decoder pushes one block back into this block


def block_bytes(tensor: np.ndarray) -> np.ndarray:
    """``tensor`` as one row of bytes per block (a view: writing it writes the cache)."""
    return tensor.reshape(BLOCKS, -1).view(np.uint8)


def pattern(tensor: int, blocks: list[int], seed: int) -> np.ndarray:
    """The bytes a worker writes into ``blocks`` of tensor ``tensor`` (the other side checks them)."""
    rng = np.random.default_rng([seed, tensor])
    table = rng.integers(0, 256, (BLOCKS, int(np.prod(BLOCK_SHAPE)) * 2), dtype=np.uint8)
    return table[blocks]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:26000", help="ip:port decoders link to")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a decoder")
    args = parser.parse_args()

    cfg = ld.LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    cfg.enable_remote_cache_accessible = True      # decoders pull from and push to this worker's cache
    dd = ld.LLMDataDist(ld.LLMRole.PROMPT, cluster_id=PROMPT_CLUSTER)
    dd.init(cfg.generate_options())                # connects to $DATADIST_DAEMON, or embedded mode

    kv = [np.zeros((BLOCKS, *BLOCK_SHAPE), np.float16) for _ in range(2 * LAYERS)]   # K0, V0, K1, V1, ...
    for i, t in enumerate(kv):                     # "prefill": what the decoder will pull
        block_bytes(t)[:MAILBOX] = pattern(i, list(range(MAILBOX)), seed=1)
    desc = ld.CacheDesc(len(kv), list(kv[0].shape), ld.DataType.DT_FLOAT16)       # DEVICE: remotely accessible
    cache = dd.cache_manager.register_blocks_cache(desc, [t.ctypes.data for t in kv],
                                                   ld.BlocksCacheKey(PROMPT_CLUSTER, 0))
    # a decoder may link as soon as this worker listens: it finds the cache (CANN also wants remotely accessible
    # caches registered before peers link)
    dd.switch_role(ld.LLMRole.PROMPT, {"llm.listenIpInfo": args.listen})   # listen once the cache is registered
    print(f"prompt: cluster {PROMPT_CLUSTER} serves {len(kv)} tensors x {BLOCKS} blocks on {args.listen}",
          flush=True)

    want = [pattern(i, [MAILBOX], seed=2) for i in range(len(kv))]   # what the decoder pushes
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:             # polls until the push landed or the deadline
        if all(np.array_equal(block_bytes(t)[[MAILBOX]], want[i]) for i, t in enumerate(kv)):
            break
        time.sleep(0.05)
    else:
        print(f"prompt: no decoder pushed block {MAILBOX} within {args.timeout:.0f}s", file=sys.stderr)
        return 1
    print(f"prompt: block {MAILBOX} pushed by the decoder arrived intact", flush=True)
    dd.cache_manager.unregister_cache(cache.cache_id)
    dd.finalize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
