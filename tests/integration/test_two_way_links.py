"""A link has two ends and either may pull and push over it, whichever side set it up (CANN's model).

CANN's docs say client/server is unrelated to the prompt/decoder role, and its C++ builds a full link
entity on the server too (``src/llm_datadist/link_mgr/link_msg_handler.cc``, ``ExchangeInfoProcess``).
Here the decoder links to the prompt's listener, then the *prompt* (the listening side) pulls and
pushes, single and concurrently; unlinking from either end tears down both. Real daemons, loopback.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import ACL_PLANE, WorkerError, free_port, over_planes
from tests.reliability.common import links

#: transfers run over tcp, nixl (UCX over TCP and over shared memory) and acl-hccl, see ``over_planes``;
#: tests of errors and limits over tcp, one nixl plane and acl-hccl (the simulated Ascend runtime)
pytestmark = pytest.mark.integration

P, D = 1, 2
TENSORS = 4
BLOCKS = 64
BLOCK_SHAPE = (8, 16)  # uint8: 128 bytes per block per tensor
OPS = "tests.compat.ops"


def link_states(daemon) -> list:  # noqa: ANN001
    return [(li.remote_cluster_id, li.state, li.initiator) for li in links(daemon)]


@pytest.fixture
def linked(daemon_factory, worker_factory):
    """The prompt listens; the decoder links to it. Both register a paged cache bound to model 0."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=10000,
                mem_pool=4 << 20)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=10000,
                mem_pool=4 << 20)
    for worker, seed in ((prompt, 1), (decoder, 2)):
        worker.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, dtype="uint8", model_id=0)
        assert worker.call("allocate", "c", TENSORS, (2, 256), dtype="uint8") == 2
        worker.call("fill", "kv", seed)
        worker.call("fill", "c", seed + 10)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    return dp, dd, prompt, decoder, port


@over_planes()
def test_the_listening_side_pulls_and_pushes(linked) -> None:
    dp, dd, prompt, decoder, port = linked
    d_kv, p_kv = decoder.call("rows", "kv"), prompt.call("rows", "kv")
    # pull from the listening side: blocks, then a contiguous batch slot by cache id (cache 2 on the decoder)
    prompt.call("pull_blocks", D, "kv", [3, 4, 60], [10, 11, 12])
    expected = p_kv.copy()
    expected[:, [10, 11, 12]] = d_kv[:, [3, 4, 60]]
    np.testing.assert_array_equal(prompt.call("rows", "kv"), expected)
    prompt.call("pull_cache", D, "c", ("id", 2, 0), batch_index=1)
    np.testing.assert_array_equal(prompt.call("rows", "c")[:, 1], decoder.call("rows", "c")[:, 0])
    with pytest.raises(WorkerError) as info:  # the owner's checks hold from this end too
        prompt.call("pull_blocks", D, "kv", [BLOCKS], [0])
    assert info.value.status_code == S.LLM_PARAM_INVALID
    # push from the listening side: blocks and a batch slot by cache id
    prompt.call("push_blocks", D, "kv", [0, 1], [40, 41])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [40, 41]), prompt.call("rows", "kv", None, [0, 1]))
    prompt.call("push_cache", D, "c", 2, batch_index=1, src_batch_index=0)
    np.testing.assert_array_equal(decoder.call("rows", "c")[:, 1], prompt.call("rows", "c")[:, 0])
    # the linking side still transfers as before
    decoder.call("pull_blocks", P, "kv", [10], [50])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [50]), prompt.call("rows", "kv", None, [10]))
    assert link_states(dp) == [(D, "established", False)] and link_states(dd) == [(P, "established", True)]


@over_planes("tcp", "nixl-ucx-shm", ACL_PLANE)
def test_twelve_threads_push_from_the_listening_side_at_once(linked) -> None:
    """SGLang's prefill pushes from its transfer threads (12 here) to the decoder that linked to it."""
    dp, dd, prompt, decoder, port = linked
    jobs = [([4 * i, 4 * i + 1, 4 * i + 2], [63 - 4 * i, 62 - 4 * i, 61 - 4 * i]) for i in range(12)]
    for _ in range(3):
        pushed = prompt.call("run", OPS, "blocks_threads", "push_blocks", D, "kv", jobs, threads=12)
        assert pushed == ["LLM_SUCCESS"] * 12
        src, dst = prompt.call("rows", "kv"), decoder.call("rows", "kv")
        for s, d in jobs:
            np.testing.assert_array_equal(dst[:, d], src[:, s])
    # pulls from the listening side, concurrently too
    pulls = [([63 - i], [i]) for i in range(12)]
    pulled = prompt.call("run", OPS, "blocks_threads", "pull_blocks", D, "kv", pulls, threads=12)
    assert pulled == ["LLM_SUCCESS"] * 12
    np.testing.assert_array_equal(prompt.call("rows", "kv", None, list(range(12))),
                                  decoder.call("rows", "kv", None, [63 - i for i in range(12)]))
    # the link is healthy afterwards, on both ends
    assert link_states(dp) == [(D, "established", False)] and link_states(dd) == [(P, "established", True)]
    decoder.call("push_blocks", P, "kv", [1], [30])
    np.testing.assert_array_equal(prompt.call("rows", "kv", None, [30]), decoder.call("rows", "kv", None, [1]))


@over_planes("tcp", "nixl-ucx-tcp", ACL_PLANE)
def test_unlink_from_either_end_tears_down_both(linked) -> None:
    dp, dd, prompt, decoder, port = linked
    assert prompt.call("unlink", D, "127.0.0.1", 1) == (0, [0])  # the listening end unlinks
    assert link_states(dp) == [] and link_states(dd) == []
    for worker, remote in ((prompt, D), (decoder, P)):
        with pytest.raises(WorkerError) as info:
            worker.call("push_blocks", remote, "kv", [0], [0])
        assert info.value.status_code == S.LLM_NOT_YET_LINK
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    prompt.call("push_blocks", D, "kv", [5], [6])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [6]), prompt.call("rows", "kv", None, [5]))
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])  # the linking end unlinks
    assert link_states(dp) == [] and link_states(dd) == []


def test_an_unlink_after_the_other_end_went_succeeds_once(linked) -> None:
    """The other end went first (a prompt that finalizes once its decoder's push landed, as the examples do): this
    end's own unlink then succeeds (docs/choices.md) and logs no warning; a second unlink finds no link."""
    dp, dd, prompt, decoder, port = linked
    prompt.call("finalize")
    for _ in range(100):   # the prompt's daemon tells the decoder's over the link before its finalize returns
        if not link_states(dd):
            break
        time.sleep(0.05)
    assert link_states(dd) == []
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])
    assert not [line for line in dd.log().splitlines() if " WARNING " in line or " ERROR " in line], dd.log()
    assert decoder.call("unlink", P, "127.0.0.1", port) == (S.LLM_NOT_YET_LINK, [S.LLM_NOT_YET_LINK])


def test_switch_role_moves_the_data_plane_to_the_listen_address(daemon_factory, worker_factory) -> None:
    """A prompt made without a listen address (its data plane on ``[transport] host``) registers its cache, then
    listens by switch_role, as the examples do: its data plane follows to the listen address, where a peer on
    another host (a firewall opening the listen port and ``data_ports``) reaches it. 127.0.0.2 stands for that
    address: a loopback address other than the default data host."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    for worker, seed in ((prompt, 1), (decoder, 2)):
        worker.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, dtype="uint8", model_id=0)
        worker.call("fill", "kv", seed)
    prompt.call("run", OPS, "switch_role", "PROMPT", f"127.0.0.2:{port}")
    assert decoder.call("link", P, "127.0.0.2", port) == (0, [0])
    assert [li.data_endpoint.rsplit(":", 1)[0] for li in links(dd)] == ["tcp://127.0.0.2"], links(dd)
    decoder.call("pull_blocks", P, "kv", [3], [9])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [9]), prompt.call("rows", "kv", None, [3]))
