"""The hccl transport against the stricter SIMULATED runtime (tests/sim: CANN's rules R1-R16, docs/ascend.md), through
two daemons, with HCCL's descriptor limit at its V2 value (64 per call), and every process in a simulated PID
namespace (its bare tgid is not its pid):

* caches allocated from the pools AFTER the link and caches the workers registered (imported NPU memory) move
  1,024 scattered blocks per tensor both ways, byte-exact (thousands of descriptors: 64 per call, one
  synchronisation; every row inside memory bound before the link's Prepare);
* an unlink and a relink to the same peer (the old communicator torn down in CANN's order first: its name is
  taken until then);
* two engines of one daemon link at the same moment (HCCL refuses concurrent communicator creation: one lock);
* memory registered after a link reaches only links made later: the transfer fails clearly, a relink moves it;
* a relink after a link whose one end failed meets only its own communicators (R15, R16: each link's are named by
  the link), and every communicator and meeting of both ends goes with the unlink;
* a pull reads the table the owner published to the link: a deallocated cache is withdrawn before another takes its
  pages (its key then reads nothing), a get that overlapped the withdrawal fails, and another engine's cache, a
  cache not remotely accessible and rows past a cache's end are not read.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import ACL_PLANE, WorkerError, free_port, over_planes
from tests.reliability.common import wait_until

pytestmark = over_planes(ACL_PLANE)

P, D, D2 = 1, 2, 3
BLOCKS, N, BLOCK = 1100, 1024, (128,)
#: HCCL's V2 limit of descriptors per call; a simulated PID namespace for every process; a communicator's creation
#: long enough that two at once overlap in it
SIM = {"ASCEND_SIM_MAX_DESC": "64", "ASCEND_SIM_TGID_OFFSET": "100000", "ASCEND_SIM_INIT_MS": "200"}


@pytest.fixture
def two(daemon_factory, worker_factory):
    dp, dd = daemon_factory.many("p", "d", env=SIM)
    port = free_port()
    prompt, decoder = worker_factory(dp, **SIM), worker_factory(dd, **SIM)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=8 << 20,
                remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, mem_pool=8 << 20, remote_cache_accessible=True)
    return dp, dd, prompt, decoder, port


def _scatter(seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    return rng.choice(BLOCKS, N, replace=False).tolist(), rng.choice(BLOCKS, N, replace=False).tolist()


def _moves(prompt, decoder, name: str, model_id: int, seed: int) -> None:
    """A pull of N scattered blocks into the decoder, a push of N others from the prompt, both byte-exact."""
    prompt.call("fill", name, seed)
    decoder.call("zero", name)
    src, dst = _scatter(seed)
    decoder.call("pull_blocks", P, name, src, dst, model_id=model_id)
    np.testing.assert_array_equal(decoder.call("rows", name, None, dst), prompt.call("rows", name, None, src))
    decoder.call("zero", name)
    src, dst = _scatter(seed + 1)
    prompt.call("push_blocks", D, name, src, dst, model_id=model_id)
    np.testing.assert_array_equal(decoder.call("rows", name, None, dst), prompt.call("rows", name, None, src))


def test_scattered_blocks_both_ways_then_relink(two) -> None:
    dp, dd, prompt, decoder, port = two
    for w in (prompt, decoder):   # the workers' own NPU memory, handed over before the link
        w.call("register_blocks", "reg", 2, BLOCKS, BLOCK, "uint8", model_id=1)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    for w in (prompt, decoder):   # carved from the pools after the link was made
        w.call("allocate", "pool", 2, (BLOCKS, *BLOCK), "uint8", blocks=True, model_id=0)
    _moves(prompt, decoder, "pool", 0, 10)
    _moves(prompt, decoder, "reg", 1, 20)
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _moves(prompt, decoder, "pool", 0, 30)


def test_two_engines_of_one_daemon_link_at_the_same_moment(two, worker_factory) -> None:
    dp, dd, prompt, decoder, port = two
    other = worker_factory(dd, **SIM)
    other.call("init", "DECODER", D2, mem_pool=8 << 20)
    prompt.call("allocate", "kv", 2, (BLOCKS, *BLOCK), "uint8", blocks=True, model_id=0)
    prompt.call("fill", "kv", 5)
    for w in (decoder, other):
        w.call("allocate", "kv", 2, (BLOCKS, *BLOCK), "uint8", blocks=True, model_id=0)
    decoder.send("link", P, "127.0.0.1", port)
    other.send("link", P, "127.0.0.1", port)
    assert decoder.result() == (0, [0]) and other.result() == (0, [0])
    src, dst = _scatter(7)
    for w in (decoder, other):
        w.call("pull_blocks", P, "kv", src, dst)
        np.testing.assert_array_equal(w.call("rows", "kv", None, dst), prompt.call("rows", "kv", None, src))


def test_memory_registered_after_the_link_needs_a_relink(two) -> None:
    dp, dd, prompt, decoder, port = two
    prompt.call("register_blocks", "kv", 2, 64, BLOCK, "uint8", model_id=0)
    prompt.call("fill", "kv", 3)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("allocate", "warm", 2, (64, *BLOCK), "uint8", blocks=True)
    decoder.call("pull_blocks", P, "warm", [0], [0])                # the link is prepared
    decoder.call("register_blocks", "kv", 2, 64, BLOCK, "uint8")   # after the link: its Prepare never saw it
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_blocks", P, "kv", [1, 2], [3, 4])
    assert info.value.status_code == S.LLM_FEATURE_NOT_ENABLED and "link again" in str(info.value)
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", [1, 2], [3, 4])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [3, 4]), prompt.call("rows", "kv", None, [1, 2]))


#: tests/sim/hccl.c pub_head: pid, prepared (in or past its Prepare), count, traffic class, service level, device, id
HEAD = struct.Struct("=iiIIIiQ")


def _comms(sim_dir: str) -> dict[int, int]:
    """The simulated HCCL's communicators alive now: instance id -> whether it is in (or past) its Prepare."""
    out = {}
    for path in Path(sim_dir).glob("comm-*-r*"):
        if not path.name.endswith(".tmp"):
            try:
                _, prepared, *_, ident = HEAD.unpack_from(path.read_bytes())
            except (OSError, struct.error):   # destroyed (or replaced) as it was read
                continue
            out[ident] = prepared
    return out


def test_a_relink_after_a_failed_link_meets_only_its_own_communicators(daemon_factory, worker_factory) -> None:
    """The prompt's end of a link fails to make its communicator (a fault the simulation injects) while the
    decoder's waits for it in its Prepare; the decoder unlinks and links again. HCCL knows a Prepare's peer by the
    communicator's name and the two addresses only (R15): had the relink's communicators the old link's name, the
    prompt's new one would meet the decoder's old one -- which then goes with the old link, taking the new one's
    connection with it (R16): every transfer of the relink would fail. Each link's communicators are named by the
    link: the relink moves bytes both ways while the old one waits out its Prepare (4 s), and when the relink goes
    too, nothing of either link is left in HCCL."""
    dp = daemon_factory("p", env={**SIM, "ASCEND_SIM_FAIL_INITS": "1"})
    dd = daemon_factory("d", env=SIM)
    sim = dd.env.get("ASCEND_SIM_DIR")
    if not sim:
        pytest.skip("needs the simulated runtime (its fault knob ASCEND_SIM_FAIL_INITS)")
    port = free_port()
    prompt, decoder = worker_factory(dp, **SIM), worker_factory(dd, **SIM)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=8 << 20, remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, mem_pool=8 << 20, remote_cache_accessible=True,
                 extra={"llm.LinkTotalTime": "4"})
    for w in (prompt, decoder):
        w.call("allocate", "kv", 2, (64, *BLOCK), "uint8", blocks=True, model_id=0)
    prompt.call("fill", "kv", 3)
    decoder.call("fill", "kv", 4)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    with pytest.raises(WorkerError) as info:   # the prompt's end has no communicator: the link is dropped
        prompt.call("push_blocks", D, "kv", [0], [0])
    assert info.value.status_code == S.LLM_NOT_YET_LINK and "HCCL_E_INTERNAL" in str(info.value)
    assert wait_until(lambda: list(_comms(sim).values()) == [1], 30), _comms(sim)   # the decoder's, in Prepare
    old = set(_comms(sim))
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    assert wait_until(lambda: not old & set(_comms(sim)), 30), _comms(sim)   # the old one went
    prompt.call("push_blocks", D, "kv", [1, 2], [3, 4])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [3, 4]), prompt.call("rows", "kv", None, [1, 2]))
    decoder.call("pull_blocks", P, "kv", [5], [6])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [6]), prompt.call("rows", "kv", None, [5]))
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])
    left = lambda: [p.name for p in Path(sim).iterdir() if p.name.startswith(("comm-", "met-"))]  # noqa: E731
    assert wait_until(lambda: not left(), 30), left()


# ---- pulls read the owner's published table (no owner call): what the table lets a puller read ---------------------

def _table_linked(prompt, decoder, port: int, rows: int = 64, row: tuple = BLOCK) -> None:
    """The prompt's cache ``kv`` (model 0, filled) published to a link the decoder made; the decoder's ``kv`` zeroed."""
    prompt.call("allocate", "kv", 2, (rows, *row), "uint8", blocks=True, model_id=0)
    prompt.call("fill", "kv", 3)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("allocate", "kv", 2, (rows, *row), "uint8", blocks=True)
    decoder.call("pull_blocks", P, "kv", [1], [1])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [1]), prompt.call("rows", "kv", None, [1]))
    decoder.call("zero", "kv")


def _refused(worker, *args, **kwargs) -> int:
    with pytest.raises(WorkerError) as info:
        worker.call(*args, **kwargs)
    return info.value.status_code


def test_a_deallocated_cache_is_withdrawn_before_another_cache_takes_its_pages(two) -> None:
    """The prompt deallocates its cache: its entry is withdrawn from the link (``W``) before the pages go back to the
    pool, and another cache (another key) takes the very same pages, filled with what the old key's reader must
    never see. HCCL cannot revoke a cache of a prepared communicator (the pool stays bound), so the table is the
    revocation: the old key reads nothing (``LLM_KV_CACHE_NOT_EXIST``, the destination untouched); the new cache
    reads by its own key."""
    dp, dd, prompt, decoder, port = two
    _table_linked(prompt, decoder, port)
    old = prompt.call("addresses", "kv")
    prompt.call("deallocate", "kv")
    prompt.call("allocate", "again", 2, (64, *BLOCK), "uint8", blocks=True, model_id=7)
    assert prompt.call("addresses", "again") == old   # the same pages
    prompt.call("fill", "again", 9)
    # a key the table lacks: the owner is asked once (a ping), and its answer follows its W on the link
    assert _refused(decoder, "pull_blocks", P, "kv", [0], [0], model_id=99) == S.LLM_KV_CACHE_NOT_EXIST
    assert _refused(decoder, "pull_blocks", P, "kv", [2, 3], [2, 3]) == S.LLM_KV_CACHE_NOT_EXIST
    assert not decoder.call("rows", "kv").any()
    decoder.call("pull_blocks", P, "kv", [2, 3], [2, 3], model_id=7)
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [2, 3]), prompt.call("rows", "again", None, [2, 3]))


def test_another_engines_cache_a_private_cache_and_rows_outside_a_cache_are_not_read(two, worker_factory) -> None:
    """The link's table holds the caches its owner engine made remotely accessible and nothing else: a cache of
    another engine of the same daemon (on the same NPU, in memory the link's communicator binds) and a cache
    registered not remotely accessible are ``LLM_KV_CACHE_NOT_EXIST``; blocks past the published cache's end are
    ``LLM_PARAM_INVALID`` (the owner's own bound check, run by the puller). Nothing lands in the destination."""
    dp, dd, prompt, decoder, port = two
    tenant = worker_factory(dp, **SIM)
    tenant.call("init", "PROMPT", 5, mem_pool=8 << 20, remote_cache_accessible=True)
    tenant.call("allocate", "kv", 2, (64, *BLOCK), "uint8", blocks=True, model_id=5)
    tenant.call("fill", "kv", 5)
    prompt.call("register_blocks", "private", 2, 64, BLOCK, "uint8", model_id=6, remote_accessible=False)
    prompt.call("fill", "private", 6)
    _table_linked(prompt, decoder, port)
    assert _refused(decoder, "pull_blocks", P, "kv", [0], [0], model_id=5) == S.LLM_KV_CACHE_NOT_EXIST
    assert _refused(decoder, "pull_blocks", P, "kv", [0], [0], model_id=6) == S.LLM_KV_CACHE_NOT_EXIST
    assert _refused(decoder, "pull_blocks", P, "kv", [63, 64], [0, 1]) == S.LLM_PARAM_INVALID
    assert not decoder.call("rows", "kv").any()
    decoder.call("pull_blocks", P, "kv", [63], [0])   # the last row is the cache's
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [0]), prompt.call("rows", "kv", None, [63]))


@pytest.fixture
def slow(daemon_factory, worker_factory):
    """``two`` on a simulated wire of 8 Mbit/s: a get of a MiB is on the wire for about a second."""
    env = {**SIM, "ASCEND_SIM_WIRE_MBPS": "8"}
    dp, dd = daemon_factory.many("p", "d", env=env)
    if not dd.env.get("ASCEND_SIM_DIR"):
        pytest.skip("needs the simulated runtime (its wire pacing, ASCEND_SIM_WIRE_MBPS)")
    port = free_port()
    prompt, decoder = worker_factory(dp, **env), worker_factory(dd, **env)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=8 << 20, remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, mem_pool=8 << 20, remote_cache_accessible=True,
                 extra={"llm.SyncKvCacheWaitTime": "20000"})
    return prompt, decoder, port


def test_a_get_that_overlapped_its_caches_withdrawal_fails(slow) -> None:
    """The prompt deallocates a cache while the decoder's get of it is on the wire. HCCL cannot stop that get (the
    pool stays bound to the link), so its bytes may be of pages the owner let go: the puller finds the entry
    withdrawn when the get ends -- checked under the lock the withdrawal takes -- and the pull fails with
    ``LLM_KV_CACHE_NOT_EXIST`` instead of reporting success."""
    prompt, decoder, port = slow
    _table_linked(prompt, decoder, port, rows=512, row=(1024,))
    decoder.send("pull_blocks", P, "kv", list(range(512)), list(range(512)))
    time.sleep(0.3)   # the get of 2 x 512 KiB is on the wire for about a second
    prompt.call("deallocate", "kv")
    with pytest.raises(WorkerError) as info:
        decoder.result(30)
    assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST and "while it was read" in info.value.message
