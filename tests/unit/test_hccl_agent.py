"""The hccl agent and the HCCL registry of the acl backend (``datadist_ascend.globalmem``) following CANN's rules,
against the SIMULATED runtime (tests/sim; the rules and their sources: docs/ascend.md) in child processes, and the
pure arithmetic they rest on (seconds for Prepare, extents cut at registrations)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from datadist_ascend.hccl import prepare_seconds
from datadistd.transport.hccl.extents import split_extents
from tests.harness import ROOT
from tests.sim import sim_env


def run(root, tmp_path, code: str, **env: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **sim_env(root, str(tmp_path)), **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


def test_prepare_takes_seconds_rounded_up_never_zero() -> None:
    """LLM-DataDist converts the link's milliseconds to HcclCommPrepare's seconds rounding up; 0 would mean HCCL's
    own default (120 s), so a share below a second is one second."""
    assert [prepare_seconds(10_000, 1), prepare_seconds(10_001, 1), prepare_seconds(10_000, 3),
            prepare_seconds(200, 1), prepare_seconds(0, 4)] == [10, 11, 4, 1, 1]


def test_extents_merged_across_two_registrations_are_cut_at_the_border() -> None:
    """Extents contiguous on both sides are merged (``pair_extents``); HCCL wants each descriptor inside ONE registered
    buffer on each side, so a merged extent crossing a border on either side is cut there."""
    mine = [(1000, 100), (1100, 100)]          # two registrations side by side
    theirs = [(5000, 150), (5150, 50)]
    local = np.array([[1000, 40], [1050, 100], [1190, 10]], dtype=np.uint64)
    remote = np.array([[5000, 40], [5090, 100], [5190, 10]], dtype=np.uint64)
    l2, r2, why = split_extents(local, remote, mine, theirs)
    assert why is None
    assert l2.tolist() == [[1000, 40], [1050, 50], [1100, 10], [1110, 40], [1190, 10]]
    assert r2.tolist() == [[5000, 40], [5090, 50], [5140, 10], [5150, 40], [5190, 10]]
    assert int(l2[:, 1].sum()) == int(local[:, 1].sum())
    # extents inside one range each come back as they are; an extent outside every range is named
    same = split_extents(local[:1], remote[:1], mine, theirs)
    assert same[0] is local[:1].base or same[0].tolist() == [[1000, 40]]
    assert split_extents(np.array([[1200, 8]], np.uint64), np.array([[5000, 8]], np.uint64), mine, theirs)[2] \
        == "extent 0 (local address 0x4b0)"


def test_registry_deregisters_from_any_thread_once_no_link_binds_it(sim_root, tmp_path) -> None:
    """A pool's registration goes when its memory goes AND no communicator binds it (the last deregistration of
    a device tears its NIC down under live links), from whatever thread frees it (HCCL's registry is the calling
    thread's device's). HCCL refuses an overlapping registration while the old one stands: the probe."""
    out = run(sim_root, tmp_path, """
        import threading
        from datadist_ascend import AscendError
        from datadist_ascend.acl import acl
        from datadist_ascend.globalmem import global_mem
        from datadist_ascend.hccl import MEM_DEVICE, hccl
        a, h, g = acl(), hccl(), global_mem()
        buf = a.malloc(0, 1 << 20)
        g.announce(0, buf, 1 << 20)
        g.activate(0)
        (rng,) = g.ranges(0)
        g.bound(rng, 1)

        def probe():
            a.set_device(0)
            try:
                h.deregister(h.register(MEM_DEVICE, buf, 4096))
                return "free"
            except AscendError as exc:
                return "registered" if exc.code == 1 else str(exc.code)

        def elsewhere(fn):
            t = threading.Thread(target=lambda: (a.set_device(1), fn())); t.start(); t.join()
        elsewhere(lambda: g.retire(0, buf))
        print(probe())
        elsewhere(lambda: g.unbound(rng, 1))
        print(probe(), g.ranges(0))
        """)
    assert out == ["registered", "free", "[]"]


def test_memory_is_freed_only_once_hccl_let_it_go_and_by_its_last_user(sim_root, tmp_path) -> None:
    """Two imports the runtime mapped at one address are one registration with two users: retiring the first keeps
    it (issue 45, finding 9: the second was dropped and the first's retirement took both). Memory a communicator
    still binds is freed after the last unbind, never under it (finding 6: an unlink that outlived its wait for
    Prepare had the pool freed under HCCL's registration). A range over 64 GiB is refused when announced on a
    device whose hccl transport runs (finding 10: HCCL refuses it at every Prepare)."""
    out = run(sim_root, tmp_path, """
        from datadist_ascend import AscendError
        from datadist_ascend.acl import acl
        from datadist_ascend.globalmem import global_mem
        a, g, freed = acl(), global_mem(), []
        buf = a.malloc(0, 1 << 20)
        g.activate(0)
        g.announce(0, buf, 1 << 20)
        g.announce(0, buf, 1 << 20)                      # the same memory again
        g.retire(0, buf, lambda: freed.append("first"))
        print(len(g.ranges(0)), freed)                   # still registered: the second import uses it
        (rng,) = g.ranges(0)
        g.bound(rng, 1)
        g.retire(0, buf, lambda: freed.append("second"))
        print(len(g.ranges(0)), freed)                   # bound: deregistered and freed at the unbind
        g.unbound(rng, 1)
        print(len(g.ranges(0)), freed)
        try:
            g.announce(0, 1 << 40, (64 << 30) + 1)
        except AscendError as exc:
            print(exc.status.name, "64 GiB" in str(exc))
        """)
    assert out == ["1", "[]", "0", "[]", "0", "['first',", "'second']", "LLM_PARAM_INVALID", "True"]


def test_an_unlink_waits_for_every_phase_of_prepare() -> None:
    """A Prepare runs three phases (connect, exchange, enable), each with the whole timeout, per try."""
    from datadistd.transport.hccl.agent import close_wait
    assert close_wait(10.0, 1) == 3 * 10 + 5.0 and close_wait(10.0, 2) == 3 * 2 * 5 + 5.0


def test_imported_memory_is_closed_from_a_thread_without_a_device(sim_root, tmp_path) -> None:
    """``aclrtIpcMemClose`` needs a context: a handle closed by whatever thread frees it sets its device first."""
    out = run(sim_root, tmp_path, """
        import os, threading
        from datadist_ascend import AscendError
        from datadist_ascend.acl import acl
        from datadistd.memory.acl import DeviceHandle
        a = acl()
        mem = a.malloc(0, 4096)
        key = a.ipc_export(0, mem, 4096)
        a.ipc_allow(0, key, [a.bare_tgid()])
        addr = a.ipc_import(0, key)
        handle = DeviceHandle(a, 0, addr, 4096, key=key)
        t = threading.Thread(target=handle.close); t.start(); t.join()
        try:
            a.address_range(0, addr)
            print("still-imported")
        except AscendError as exc:
            print("closed")
        """)
    assert out == ["closed"]


AGENTS = '''
import multiprocessing as mp, os, time
import numpy as np
from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, acl
from datadist_ascend.globalmem import global_mem
from datadistd.core.errors import DataDistError
from datadistd.transport.hccl.agent import HcclAgent

SIZE = 4 << 20
LINK = os.urandom(32)   # the link's token, which both ends hold (fork: the peer's is the same)


def agent(name, server="10.0.0.1", ip="192.168.100.101", timeout=20):
    """An agent on NPU 0 of server ``server`` (its NIC address: the generated hccn.conf's)."""
    a = acl()
    buf = a.malloc(0, SIZE)
    global_mem().announce(0, buf, SIZE)
    return a, buf, HcclAgent(name, 0, server, ip, prepare_timeout=timeout)


def peer_main(conn, meta_patch):
    from tests.sim import write_hccn_conf   # the peer is another server: its NPU 0 has a NIC of its own
    os.environ["ASCEND_SIM_HCCN_CONF"] = write_hccn_conf(os.path.join(os.environ["ASCEND_SIM_DIR"], "b.conf"), 101)
    a, buf, ag = agent("b", server="10.0.0.2", ip="192.168.101.101")
    data = ((np.arange(SIZE) * 7 + 1) & 0xFF).astype(np.uint8)
    a.memcpy(0, buf, SIZE, data.ctypes.data, SIZE, MEMCPY_HOST_TO_DEVICE)
    meta = ag.metadata()
    conn.send((meta_patch(meta), buf))
    ag.add_peer(conn.recv(), LINK)
    conn.recv()
    ag.close()


def linked(meta_patch=lambda m: m, **identity):
    mine, theirs = mp.Pipe()
    p = mp.get_context("fork").Process(target=peer_main, args=(theirs, meta_patch), daemon=True)
    p.start()
    a, buf, ag = agent("a", **identity)
    meta, other = mine.recv()
    mine.send(ag.metadata())
    return p, mine, a, buf, ag, ag.add_peer(meta, LINK), other
'''


def test_a_batch_that_fails_half_way_is_aborted(sim_root, tmp_path) -> None:
    """A peer whose identity claims more memory than it bound: HCCL refuses the descriptor past its buffer after
    enqueuing the ones before it. The agent aborts the stream (CANN does on any failure), so none of those lands
    later -- the next transfer's synchronisation would otherwise run them (the wire is paced: 1 MB/s)."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import json
        def claim_more(meta):
            d = json.loads(meta)
            d["ranges"] = [[b, 2 * n] for b, n in d["ranges"]]
            return json.dumps(d).encode()
        p, conn, a, buf, ag, peer, other = linked(claim_more)
        blk = 256 << 10
        local = np.array([[buf + i * blk, blk] for i in range(4)] + [[buf, 64]], np.uint64)
        remote = np.array([[other + i * blk, blk] for i in range(4)] + [[other + SIZE, 64]], np.uint64)
        try:
            ag.read(local, remote, peer, time.monotonic() + 30)
        except DataDistError as exc:
            print(exc.code.name)
        ag.read(np.array([[buf + SIZE - 64, 64]], np.uint64), np.array([[other, 64]], np.uint64), peer,
                time.monotonic() + 30)
        got = np.zeros(blk, np.uint8)
        a.memcpy(0, got.ctypes.data, blk, buf + 3 * blk, blk, MEMCPY_DEVICE_TO_HOST)
        print(bool(got.any()))
        conn.send("bye"); ag.close(); p.join()
        """), ASCEND_SIM_WIRE_MBPS="8")
    assert out == ["LLM_FAILED", "False"]


def test_a_device_ip_hccl_could_only_fail_on_is_refused_before_hccl(sim_root, tmp_path) -> None:
    """No address, a loopback one, one of this host's own (a host NIC's, not an NPU's) or the peer's: refused at
    link time, before any communicator, naming the address, where it came from and how to set it."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import json
        for ip in ("", "127.0.0.1", "0.0.0.0", "192.168.101.101"):
            a, buf, ag = agent("a" + ip, ip=ip)
            ag._ip_source = "a test"
            meta = json.dumps({"name": "b", "server_id": "10.0.0.2", "device_ip": "192.168.101.101",
                               "device_id": "0", "ranges": []}).encode()
            try:
                ag.add_peer(meta, b"link")
                print("linked")
            except DataDistError as exc:
                print(exc.code.name, ip in exc.message, "from a test" in exc.message, "hccn_tool -i 0" in exc.message,
                      len(ag._comms))
            ag.close()
        """))
    assert out == ["LLM_LINK_FAILED", "True", "True", "True", "0"] * 4


def test_unlink_sets_the_engines_device_whatever_the_thread_says(sim_root, tmp_path) -> None:
    """The thread that unlinks had the engine's device in the runtime's per-thread cache, but user code (say
    ``torch_npu``) switched it to another NPU: the teardown still unbinds (HCCL's registry is the current device's)
    and destroys the communicator."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import threading
        p, conn, a, buf, ag, peer, other = linked()
        ag.read(np.array([[buf, 64]], np.uint64), np.array([[other, 64]], np.uint64), peer, time.monotonic() + 30)
        def unlink():
            a.use(0)
            a._fn["aclrtSetDevice"](1)     # behind the cache's back
            ag.drop_peer(peer)
        t = threading.Thread(target=unlink); t.start(); t.join()
        print([sorted(r.binds) for r in global_mem().ranges(0)])
        conn.send("bye"); ag.close(); p.join()
        """))
    assert out == ["[[]]"]


def test_new_memory_where_bound_memory_was_is_refused_until_the_link_goes(sim_root, tmp_path) -> None:
    """HCCL knows memory by address and keeps a registration while a link binds it: memory announced at the address
    of retired memory still bound is refused (saying to unlink), and registered once the link let it go."""
    out = run(sim_root, tmp_path, """
        from datadist_ascend import AscendError
        from datadist_ascend.acl import acl
        from datadist_ascend.globalmem import global_mem
        a, g = acl(), global_mem()
        buf = a.malloc(0, 1 << 20)
        g.activate(0)
        g.announce(0, buf, 1 << 20)
        (rng,) = g.ranges(0)
        g.bound(rng, 1)
        g.retire(0, buf)
        try:
            g.announce(0, buf, 1 << 20)
        except AscendError as exc:
            print(exc.status.name, "unlink" in str(exc))
        g.unbound(rng, 1)
        g.announce(0, buf, 1 << 20)
        print(len(g.ranges(0)), g.ranges(0)[0] is not rng)
        """)
    assert out == ["LLM_PARAM_INVALID", "True", "1", "True"]


def test_a_relink_gets_a_communicator_of_its_own_and_the_old_one_goes_after_its_prepare(sim_root, tmp_path) -> None:
    """Unlinked while its Prepare still waits for the peer, the communicator is torn down when Prepare ends (never
    under it: HCCL refuses unbind and destroy then). A relink to the same peer makes its own communicator at once:
    named by its link, never the old one's (HCCL refuses a name twice on a device, and a peer could meet the wrong
    one); it prepares in its turn (and times out here: the peer never comes). The peer's identity again on a link
    makes nothing new. Both go with the agent: no communicator and no meeting left in the simulation's directory."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import glob, json
        a, buf, ag = agent("a", timeout=2)
        meta = json.dumps({"name": "b", "server_id": "10.0.0.1", "device_ip": "10.0.0.1", "device_id": "0",
                           "ranges": []}).encode()
        ag.add_peer(meta, b"link-1")
        ag.drop_peer("b")            # its Prepare runs on (2 s): torn down after
        ag.add_peer(meta, b"link-2")
        first = ag._comms["b"]
        ag.add_peer(meta, b"link-2")  # the same link's identity again: the same communicator
        print(ag._comms["b"] is first)
        try:
            ag.read(np.array([[buf, 64]], np.uint64), np.array([[buf, 64]], np.uint64), "b", time.monotonic() + 30)
        except DataDistError as exc:
            print(exc.code.name)
        ag.close()
        print(sum(len(glob.glob(os.path.join(os.environ["ASCEND_SIM_DIR"], f))) for f in ("comm-*", "met-*")))
        """))
    assert out == ["True", "LLM_TIMEOUT", "0"]   # not LLM_PARAM_INVALID ("comm Name exist"); nothing left


def test_an_identity_of_another_agent_on_a_link_leaves_that_agents_communicator(sim_root, tmp_path) -> None:
    """A peer sends, on its own link, the identity of another agent this one is linked with: refused -- a link is
    one agent's -- and that agent's communicator is neither replaced nor torn down."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import json
        a, buf, ag = agent("a", timeout=2)
        ident = lambda n: json.dumps({"name": n, "server_id": "10.0.0.1", "device_ip": "10.0.0.1", "device_id": "0",
                                      "ranges": []}).encode()
        ag.add_peer(ident("b"), b"link-b")
        ag.add_peer(ident("c"), b"link-c")
        first = ag._comms["b"]
        try:
            ag.add_peer(ident("b"), b"link-c")
        except DataDistError as exc:
            print(exc.code.name)
        print(ag._comms["b"] is first, first.stop)
        ag.close()
        """))
    assert out == ["LLM_LINK_FAILED", "True", "False"]


def test_a_meta_whose_identity_names_another_agent_is_refused_before_it_touches_that_agents_link(sim_root,
                                                                                                  tmp_path) -> None:
    """A peer's META names it one agent while the identity it carries names another this engine is linked with:
    refused before any communicator is made -- that agent's stays as it was."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import json
        from datadistd.transport.hccl import HcclTransport
        from datadistd.transport.onesided import LinkPeer
        a, buf, _ = agent("unused")
        t = HcclTransport(device_id=0, device_ip="192.168.100.101", server_id="10.0.0.1", prepare_timeout=2)
        t.start()
        ident = json.dumps({"name": "x", "server_id": "10.0.0.1", "device_ip": "10.0.0.1", "device_id": "0",
                            "ranges": []}).encode()
        t._bind_agent(LinkPeer(t, b"x" * 32, outbound=False), "x", ident)
        first = t._agent()._comms["x"]
        try:
            t._bind_agent(LinkPeer(t, b"e" * 32, outbound=False), "evil", ident)
        except ValueError as exc:
            print("refused")
        print(t._agent()._comms["x"] is first, first.stop)
        t.stop()
        """))
    assert out == ["refused", "True", "False"]


def test_two_links_made_at_once_reach_both_ends_in_either_order_and_keep_one_communicator(sim_root,
                                                                                          tmp_path) -> None:
    """Two links with one peer made at once from both ends (a comm domain: each member links to the other) reach
    the two agents in opposite orders: both keep the communicator of the smaller link token, whichever came first
    -- else each end would keep another and neither would ever meet its peer's."""
    out = run(sim_root, tmp_path, AGENTS + textwrap.dedent("""
        import json
        meta = json.dumps({"name": "b", "server_id": "10.0.0.1", "device_ip": "10.0.0.1", "device_id": "0",
                           "ranges": []}).encode()
        ends = [agent("a", timeout=1)[2], agent("c", timeout=1)[2]]
        for ag, order in zip(ends, ((b"link-1", b"link-2"), (b"link-2", b"link-1"))):
            for link in order:
                ag.add_peer(meta, link)
        print(*[ag._comms["b"].link.decode() for ag in ends])
        for ag in ends:
            ag.close()
        """))
    assert out == ["link-1", "link-1"]


def test_npu_addresses_are_derived_as_cann_derives_them(tmp_path, monkeypatch) -> None:
    """By physical id: ``hccl_device_ip`` (one, or a list) overrides; else hccn.conf's address_<id>; only when that
    file does not exist, ``hccn_tool -i <id> -ip -g`` (hixl hixl_utils.cc GetDeviceIp); none: "" and why."""
    from datadistd.transport.hccl.transport import npu_address
    from tests.sim import HERE, write_hccn_conf

    conf = write_hccn_conf(tmp_path / "hccn.conf", 7)
    assert npu_address(5, "10.0.0.9", conf) == ("10.0.0.9", "[transport] hccl_device_ip")
    assert npu_address(1, "10.0.0.1,10.0.0.2", conf)[0] == "10.0.0.2"
    assert npu_address(5, "", conf) == ("192.168.7.106", f"{conf} address_5")
    assert npu_address(9, "", conf) == ("", f"{conf}, which has no address_9")
    monkeypatch.setenv("ASCEND_SIM_HCCN_CONF", conf)   # what the simulated hccn_tool answers from
    missing = str(tmp_path / "absent.conf")
    assert npu_address(3, "", missing, str(HERE / "hccn_tool")) == ("192.168.7.104", "`hccn_tool -i 3 -ip -g`")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert npu_address(3, "", missing, str(tmp_path / "no-tool"))[0] == ""
