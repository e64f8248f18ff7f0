"""``make demo``: a prefill node and a decode node exchanging a paged KV cache over datadist.

Two ``datadistd`` daemons on loopback (one per "node"), two worker processes using only the
public ``llm_datadist`` API the way vLLM-style connectors do:

* prefill worker: ``LLMDataDist(PROMPT)``, allocates its paged KV cache itself (numpy, K and V
  per layer), fills it with deterministic bytes, ``register_blocks_cache`` with a ``BlocksCacheKey``,
  and only then listens on 127.0.0.1 (``switch_role`` with ``llm.listenIpInfo``);
* decode worker: ``LLMDataDist(DECODER)``, registers an empty cache of the same layout,
  ``link_clusters`` to the prefill node, pulls a shuffled block table in batches
  (``pull_blocks``), verifies every byte against the generator, prints throughput;
* both unlink and finalize. Exit status 1 if any byte is wrong.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

from tests.daemonproc import DaemonProcess, free_port

LAYERS, BLOCK_TOKENS, HEADS, HEAD_DIM = 8, 16, 8, 64
NUM_BLOCKS = 512
PREFILL_CLUSTER, DECODE_CLUSTER = 1, 2


def _expected(tensor: int, num_blocks: int) -> np.ndarray:
    return np.random.default_rng(1000 + tensor).integers(0, 256, (num_blocks, BLOCK_TOKENS * HEADS * HEAD_DIM * 2),
                                                         dtype=np.uint8)


def _config(ld):  # noqa: ANN001, ANN202
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    cfg.sync_kv_timeout = 20000
    return cfg.generate_options()


def _kv_cache(ld, num_blocks: int):  # noqa: ANN001, ANN202
    shape = (num_blocks, BLOCK_TOKENS, HEADS, HEAD_DIM)
    tensors = [np.zeros(shape, dtype=np.float16) for _ in range(2 * LAYERS)]  # K0, V0, K1, V1, ...
    desc = ld.CacheDesc(len(tensors), list(shape), ld.DataType.DT_FLOAT16)  # DEVICE, as vLLM registers
    return tensors, desc


def prefill_worker(daemon: str, listen: str, num_blocks: int, ready, done) -> None:  # noqa: ANN001
    os.environ["DATADIST_DAEMON"] = daemon
    import llm_datadist as ld

    dd = ld.LLMDataDist(ld.LLMRole.PROMPT, PREFILL_CLUSTER)
    dd.init(_config(ld))
    tensors, desc = _kv_cache(ld, num_blocks)
    for i, t in enumerate(tensors):
        t.reshape(num_blocks, -1).view(np.uint8)[:] = _expected(i, num_blocks)
    cache = dd.cache_manager.register_blocks_cache(desc, [t.ctypes.data for t in tensors],
                                                   ld.BlocksCacheKey(PREFILL_CLUSTER, 0))
    dd.switch_role(ld.LLMRole.PROMPT, {"llm.listenIpInfo": listen})   # listen once there is a cache to pull
    ready.set()
    done.wait(300)
    dd.cache_manager.unregister_cache(cache.cache_id)
    dd.finalize()


def progress_bar(tqdm, total: int, file=None):  # noqa: ANN001, ANN201
    """A byte counter in binary units (MiB), the units of the summary line: tqdm's "M" would be 10**6 bytes."""
    return tqdm(total=total, unit="iB", unit_scale=True, unit_divisor=1024, desc="pull_blocks", file=file or sys.stdout,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}iB/{total_fmt}iB "
                           "[{elapsed}<{remaining}, {rate_fmt}]")


def decode_worker(daemon: str, listen: str, num_blocks: int, pulled: int, batch: int, result) -> None:  # noqa: ANN001
    os.environ["DATADIST_DAEMON"] = daemon
    import llm_datadist as ld

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; stay usable without it
        tqdm = None
    dd = ld.LLMDataDist(ld.LLMRole.DECODER, DECODE_CLUSTER)
    dd.init(_config(ld))
    tensors, desc = _kv_cache(ld, num_blocks)
    cache = dd.cache_manager.register_blocks_cache(desc, [t.ctypes.data for t in tensors])
    ip, port = listen.rsplit(":", 1)
    info = ld.LLMClusterInfo()
    info.remote_cluster_id = PREFILL_CLUSTER
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(ip, int(port))
    t0 = time.perf_counter()
    code, codes = dd.link_clusters([info], 5000)
    link_ms = (time.perf_counter() - t0) * 1000
    if code != ld.LLMStatusCode.LLM_SUCCESS:
        result.put(("link failed", str(code), [str(c) for c in codes]))
        dd.finalize()
        return
    rng = np.random.default_rng(7)
    src = rng.permutation(num_blocks)[:pulled].tolist()
    dst = rng.permutation(num_blocks)[:pulled].tolist()
    block_bytes = BLOCK_TOKENS * HEADS * HEAD_DIM * 2
    total = pulled * block_bytes * len(tensors)
    bar = progress_bar(tqdm, total) if tqdm else None
    t0 = time.perf_counter()
    for i in range(0, pulled, batch):
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(PREFILL_CLUSTER, 0), cache, src[i:i + batch],
                                     dst[i:i + batch])
        if bar is not None:
            bar.update(len(src[i:i + batch]) * block_bytes * len(tensors))
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    wrong = 0
    for t_index, t in enumerate(tensors):
        got = t.reshape(num_blocks, -1).view(np.uint8)
        want = _expected(t_index, num_blocks)
        wrong += int(np.count_nonzero(got[dst] != want[src]))
        untouched = np.setdiff1d(np.arange(num_blocks), dst)
        wrong += int(np.count_nonzero(got[untouched]))
    dd.unlink_clusters([info], 5000)
    dd.cache_manager.unregister_cache(cache.cache_id)
    dd.finalize()
    result.put(("ok", total, seconds, wrong, link_ms))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=NUM_BLOCKS, help="blocks in each node's KV cache")
    p.add_argument("--pull", type=int, default=384, help="blocks the decoder pulls (shuffled)")
    p.add_argument("--batch", type=int, default=64, help="blocks per pull_blocks call")
    args = p.parse_args(argv)
    args.pull = min(args.pull, args.blocks)
    block_kib = BLOCK_TOKENS * HEADS * HEAD_DIM * 2 // 1024
    print(f"datadist demo: {LAYERS} layers x (K, V), {args.blocks} blocks of {BLOCK_TOKENS} tokens "
          f"({block_kib} KiB per block per tensor), {2 * LAYERS * args.blocks * block_kib // 1024} MiB per node")
    daemons = [DaemonProcess(name, {"DATADISTD_DAEMON_LOG_LEVEL": "WARNING"}, dir_prefix="datadist-demo-")
               for name in ("prefill-node", "decode-node")]
    ctx = mp.get_context("spawn")
    try:
        for d in daemons:
            d.start()
        prefill_sock, decode_sock = (d.target for d in daemons)
        print(f"  prefill node daemon: {prefill_sock}\n  decode node daemon:  {decode_sock}")
        listen = f"127.0.0.1:{free_port()}"
        ready, done, result = ctx.Event(), ctx.Event(), ctx.Queue()
        prefill = ctx.Process(target=prefill_worker, args=(prefill_sock, listen, args.blocks, ready, done))
        prefill.start()
        if not ready.wait(60):
            print("prefill worker did not come up", file=sys.stderr)
            return 1
        print(f"  prefill worker: cluster {PREFILL_CLUSTER}, listening on {listen}, KV cache registered and filled")
        decode = ctx.Process(target=decode_worker,
                             args=(decode_sock, listen, args.blocks, args.pull, args.batch, result))
        decode.start()
        outcome = result.get(timeout=300)
        decode.join(30)
        done.set()
        prefill.join(30)
    finally:
        for d in daemons:
            d.stop()
    if outcome[0] != "ok":
        print(f"FAILED: {outcome}", file=sys.stderr)
        return 1
    _, total, seconds, wrong, link_ms = outcome
    print(f"  decode worker: linked in {link_ms:.1f} ms; pulled {args.pull} shuffled blocks x {2 * LAYERS} tensors = "
          f"{total / 2**20:.0f} MiB in {seconds * 1000:.0f} ms ({total / seconds / 2**30:.2f} GiB/s) over tcp")
    if wrong:
        print(f"FAILED: {wrong} bytes differ from what the prefill node wrote", file=sys.stderr)
        return 1
    print("  verified: every pulled byte matches; untouched blocks stayed zero. Unlinked and finalized.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
