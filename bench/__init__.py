"""``make bench``: datadist measured against the limits of the machine it runs on.

Starts real ``datadistd`` daemons and worker processes on this machine, runs fifteen scenarios
(bulk over tcp, same-host, small-transfer latency, block-list scaling, concurrency, layer-wise
overlap, link setup, model-shaped requests, nixl, hccl, the tcp transport alone, Python calls per
pull, links at rest, a peer's death, CANN's HIXL engine), and writes
``bench/results/latest.json``, ``latest.md`` and PNG plots.
Every figure is a median of repetitions with min and max; every scenario reports a ratio to a
baseline measured in the same run. See ``docs/performance.md``.
"""
