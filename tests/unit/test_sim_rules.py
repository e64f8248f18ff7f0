"""Each rule of CANN's runtime the SIMULATED Ascend runtime enforces (tests/sim/hccl.c R1-R11, R14-R16,
ascendcl.c R12-R13; the vendor source of each is named there and in docs/ascend.md), called through the ctypes
bindings in child processes, one test per rule. Each was checked to fail with its rule taken out of the simulation.

A two-rank test runs rank 1 in a forked child (``PEER``): it registers and binds 1 MiB of device memory holding
bytes ``(i * 7 + 1) & 0xff``, prepares, sends its address, and waits for the word to go."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.harness import ROOT
from tests.sim import sim_env

PRELUDE = '''
import ctypes, os, sys, threading, time, multiprocessing as mp
import numpy as np
from datadist_ascend import AscendError
from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, acl
from datadist_ascend.hccl import MEM_DEVICE, CommConfig, OneSideOpDesc, descriptors, hccl
from datadistd.transport.hccl.agent import cluster_table

SIZE = 1 << 20
from tests.sim import write_hccn_conf
#: two simulated servers (rank 0 here, rank 1 the forked PEER with its own hccn.conf), NPU 0 on each
NICS = {0: "192.168.100.101", 1: "192.168.101.101"}
TABLE, _ = cluster_table([{"name": n, "server_id": f"s{r}", "device_id": "0", "device_ip": NICS[r]}
                          for r, n in enumerate("ab")])


def other_server():
    """This process is the second simulated server from now on (its NPUs' NIC addresses: 192.168.101.x)."""
    os.environ["ASCEND_SIM_HCCN_CONF"] = write_hccn_conf(os.path.join(os.environ["ASCEND_SIM_DIR"], "hccn-101.conf"),
                                                         101)
PATTERN = ((np.arange(SIZE) * 7 + 1) & 0xFF).astype(np.uint8)


def code(fn):
    try:
        fn()
        return "ok"
    except AscendError as exc:
        return str(exc.code)


def rank(r, name="t"):
    a, h = acl(), hccl()
    a.set_device(0)
    buf = a.malloc(0, SIZE)
    tok = h.register(MEM_DEVICE, buf, SIZE)
    comm = h.init_comm(TABLE, r, CommConfig.make(name))
    return a, h, buf, tok, comm, a.create_stream(0)


def raw(h, put, comm, local, remote, lengths, stream):
    """One HcclBatchPut/Get call of all the descriptors (Hccl.batch cuts them into calls of 64)."""
    d = descriptors(local, remote, lengths)
    h._call("HcclBatchPut" if put else "HcclBatchGet", ctypes.c_void_p(comm), 1 - r0,
            d.ctypes.data_as(ctypes.POINTER(OneSideOpDesc)), len(d), ctypes.c_void_p(stream))


def peer_main(conn, late_bind, delay):
    other_server()
    a, h, buf, tok, comm, s = rank(1)
    a.memcpy(0, buf, SIZE, PATTERN.ctypes.data, SIZE, MEMCPY_HOST_TO_DEVICE)
    h.bind(comm, tok)
    extra = 0
    time.sleep(delay)
    h.prepare(comm, 30)
    if late_bind:   # bound after Prepare: recorded, never visible to rank 0
        extra = a.malloc(0, SIZE)
        h.bind(comm, h.register(MEM_DEVICE, extra, SIZE))
        h.prepare(comm, 30)
    conn.send((buf, extra))
    conn.recv()


def peer(late_bind=False, delay=0.0):
    mine, theirs = mp.Pipe()
    p = mp.get_context("fork").Process(target=peer_main, args=(theirs, late_bind, delay), daemon=True)
    p.start()
    return p, mine


def table(version="1.0", ips=(NICS[0], NICS[1]), sdids=None, port=None, servers=("s0", "s1"), pods=("0", "0")):
    """A two-rank table by hand: rank 0 on server s0 (NPU 0), rank 1 on s1; a 1.2 table with its super pod. Two
    ranks of one server are its NPUs 0 and 1."""
    import json
    server_list = []
    for r in (0, 1):
        dev = {"device_id": str(r if servers[0] == servers[1] else 0), "device_ip": ips[r], "rank_id": str(r)}
        if sdids is not None:
            dev["super_device_id"] = sdids[r]
        if port is not None:
            dev["device_port"] = str(port)
        if server_list and server_list[-1]["server_id"] == servers[r]:
            server_list[-1]["device"].append(dev)
        else:
            server_list.append({"server_id": servers[r], "device": [dev]})
    t = {"version": version, "server_count": str(len(server_list)), "server_list": server_list, "status": "completed"}
    if version == "1.2":
        t["super_pod_list"] = [{"super_pod_id": p, "server_list": [{"server_id": s} for s, q in zip(servers, pods)
                                                                    if q == p]} for p in sorted(set(pods))]
    return json.dumps(t)


r0 = 0
'''


def run(root, tmp_path, body: str, **env: str) -> list[str]:
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **sim_env(root, str(tmp_path)), **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split() + (["STDERR:" + proc.stderr.strip()] if proc.stderr.strip() else [])


def test_r1_prepare_timeout_is_seconds(sim_root, tmp_path) -> None:
    """A peer that arrives half a second late is met within a timeout of 30 (seconds; 30 ms would not wait);
    below -1 is refused."""
    out = run(sim_root, tmp_path, """
        p, conn = peer(delay=0.5)
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok)
        print(code(lambda: h.prepare(comm, -2)), code(lambda: h.prepare(comm, 30)))
        conn.recv(); conn.send("bye"); p.join()
        """)
    assert out == ["1", "ok"]   # HCCL_E_PARA, then met


def test_r2_at_most_256_descriptors_per_call_or_the_knob(sim_root, tmp_path) -> None:
    body = """
        p, conn = peer()
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok); h.prepare(comm, 30)
        other, _ = conn.recv()
        offs = np.arange(300, dtype=np.uint64) * 16
        for n in (64, 65, 256, 257):
            print(code(lambda: raw(h, False, comm, buf + offs[:n], other + offs[:n], 16, s)))
        a.synchronize(0, s, 10000)
        conn.send("bye"); p.join()
        """
    assert run(sim_root, tmp_path, body) == ["ok", "ok", "ok", "1"]
    assert run(sim_root, tmp_path, body, ASCEND_SIM_MAX_DESC="64") == ["ok", "1", "1", "1"]


def test_r3_memory_bound_after_prepare_is_not_seen_by_the_peer(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        p, conn = peer(late_bind=True)
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok); h.prepare(comm, 30)
        early, late = conn.recv()
        print(code(lambda: raw(h, False, comm, [buf], [early], [4096], s)),
              code(lambda: raw(h, False, comm, [buf], [late], [4096], s)))
        a.synchronize(0, s, 10000)
        conn.send("bye"); p.join()
        """)
    assert out == ["ok", "4"]   # HCCL_E_INTERNAL: "Can't find remoteBuffer by key"


def test_r4_each_descriptor_inside_one_enabled_buffer(sim_root, tmp_path) -> None:
    """Two registrations side by side (halves of one allocation): a descriptor across their border fails (though
    both halves are bound and the bytes contiguous), one in either half moves."""
    out = run(sim_root, tmp_path, """
        p, conn = peer()
        a, h = acl(), hccl()
        a.set_device(0)
        buf = a.malloc(0, SIZE)
        half = SIZE // 2
        t1, t2 = h.register(MEM_DEVICE, buf, half), h.register(MEM_DEVICE, buf + half, half)
        comm = h.init_comm(TABLE, 0, CommConfig.make("t")); s = a.create_stream(0)
        h.bind(comm, t1); h.bind(comm, t2); h.prepare(comm, 30)
        other, _ = conn.recv()
        print(code(lambda: raw(h, False, comm, [buf + half - 8], [other], [16], s)),
              code(lambda: raw(h, False, comm, [buf + half - 16, buf + half], [other, other + 16], [16, 16], s)))
        a.synchronize(0, s, 10000)
        conn.send("bye"); p.join()
        """)
    assert out == ["4", "ok"]


def test_r5_a_second_prepare_is_a_no_op(sim_root, tmp_path) -> None:
    """Once prepared, Prepare returns at once: even with the peer gone it neither waits nor fails."""
    out = run(sim_root, tmp_path, """
        p, conn = peer()
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok); h.prepare(comm, 30)
        conn.recv(); conn.send("bye"); p.join()
        print(code(lambda: h.prepare(comm, 1)))
        """)
    assert out == ["ok"]


def test_r6_the_registry_is_the_calling_threads_devices(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        buf = a.malloc(0, SIZE)
        tok = h.register(MEM_DEVICE, buf, SIZE)
        print(h.register(MEM_DEVICE, buf, SIZE) == tok, code(lambda: h.register(MEM_DEVICE, buf + 4096, 4096)))
        comm = h.init_comm(TABLE, 0, CommConfig.make("t"))
        h.bind(comm, tok)
        print(code(lambda: h.deregister(tok)))                 # bound
        a.set_device(1)                                         # the thread on another NPU: not its registry
        print(code(lambda: h.unbind(comm, tok)))
        a.set_device(0)
        h.unbind(comm, tok)
        a.set_device(1)
        print(code(lambda: h.deregister(tok)))
        a.set_device(0)
        print(code(lambda: h.deregister(tok)))
        """)
    assert out == ["True", "1", "1", "1", "1", "ok"]   # PARA overlap, PARA bound, PARA elsewhere (R23)


def test_r7_the_last_deregistration_tears_the_nic_down_under_live_comms(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        p, conn = peer()
        a, h, buf, tok, comm, s = rank(0)
        spare = a.malloc(0, 4096)
        keep = h.register(MEM_DEVICE, spare, 4096)             # another registration of device 0
        h.bind(comm, tok); h.prepare(comm, 30)
        other, _ = conn.recv()
        h.unbind(comm, tok); h.deregister(tok)
        print(code(lambda: raw(h, False, comm, [buf], [other], [64], s)))
        a.synchronize(0, s, 10000)
        h.deregister(keep)                                      # the last one: the NIC goes
        print(code(lambda: raw(h, False, comm, [buf], [other], [64], s)))
        conn.send("bye"); p.join()
        """)
    assert out == ["ok", "19"]   # HCCL_E_NETWORK


def test_r8_destroy_is_refused_while_memory_is_bound(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok)
        print(code(lambda: h.destroy(comm)))
        h.unbind(comm, tok)
        print(code(lambda: h.destroy(comm)))
        """)
    assert out == ["1", "ok"]


def test_r9_communicator_names_are_unique_per_device(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        first = h.init_comm(TABLE, 0, CommConfig.make("same"))
        print(code(lambda: h.init_comm(TABLE, 0, CommConfig.make("same"))))
        a.set_device(1)
        print(code(lambda: h.init_comm(TABLE, 0, CommConfig.make("same"))))
        a.set_device(0)
        h.destroy(first)
        print(code(lambda: h.init_comm(TABLE, 0, CommConfig.make("same"))))
        """)
    assert out == ["1", "ok", "ok"]


def test_r10_concurrent_communicator_creation_fails_loudly(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        results, gate = [], threading.Barrier(2)
        def make(name):
            a.set_device(0)
            gate.wait()
            results.append(code(lambda: h.init_comm(TABLE, 0, CommConfig.make(name))))
        threads = [threading.Thread(target=make, args=(n,)) for n in ("x", "y")]
        [t.start() for t in threads]; [t.join() for t in threads]
        print(*sorted(results))
        """, ASCEND_SIM_INIT_MS="500")
    assert out[:2] == ["4", "ok"] and "concurrent HcclCommInitClusterInfoMemConfig" in out[-1]


def test_r11_descriptors_before_a_bad_one_stay_enqueued(sim_root, tmp_path) -> None:
    """The call fails on its second descriptor; the first one's bytes land all the same (unless the stream is
    aborted: the transport does, tests/integration/test_hccl_cann.py)."""
    out = run(sim_root, tmp_path, """
        p, conn = peer()
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok); h.prepare(comm, 30)
        other, _ = conn.recv()
        print(code(lambda: raw(h, False, comm, [buf, buf + 4096], [other, other + SIZE], [4096, 4096], s)))
        a.synchronize(0, s, 10000)
        got = np.zeros(4096, np.uint8)
        a.memcpy(0, got.ctypes.data, 4096, buf, 4096, MEMCPY_DEVICE_TO_HOST)
        print(bool((got == PATTERN[:4096]).all()))
        conn.send("bye"); p.join()
        """)
    assert out == ["4", "True"]


def test_r12_the_allow_list_names_the_bare_tgid(sim_root, tmp_path) -> None:
    """In a simulated PID namespace the driver knows this process by another pid than ``getpid()``: only that one
    in the allow list lets it import."""
    out = run(sim_root, tmp_path, """
        a = acl()
        mem = a.malloc(0, 4096)
        print(a.bare_tgid() - os.getpid())
        for pid in (os.getpid(), a.bare_tgid()):
            key = a.ipc_export(0, mem, 4096)
            a.ipc_allow(0, key, [pid])
            print(code(lambda: a.ipc_import(0, key)))
        """, ASCEND_SIM_TGID_OFFSET="1000")
    assert out == ["1000", "207006", "ok"]   # ACL_ERROR_RT_NO_PERMISSION, then imported


def test_r13_ipc_close_and_set_import_pid_need_a_context(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a = acl()
        key = a.ipc_export(0, a.malloc(0, 4096), 4096)
        codes = []
        def bare():   # a thread that never set a device
            pid = ctypes.c_int32(os.getpid())
            codes.append(a._fn["aclrtIpcMemSetImportPid"](key.encode(), ctypes.byref(pid), 1))
            codes.append(a._fn["aclrtIpcMemClose"](key.encode()))
        t = threading.Thread(target=bare); t.start(); t.join()
        print(*codes, code(lambda: a.ipc_allow(0, key, [os.getpid()])), code(lambda: a.ipc_close(0, key)))
        """)
    assert out == ["107002", "107002", "ok", "ok"]   # ACL_ERROR_RT_CONTEXT_NULL


def test_r14_no_bind_unbind_or_destroy_while_prepare_runs(sim_root, tmp_path) -> None:
    """Prepare waits for a peer that never comes (2 s); meanwhile bind, unbind and destroy fail loudly; after it,
    unbind and destroy go through."""
    out = run(sim_root, tmp_path, """
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok)
        other = h.register(MEM_DEVICE, a.malloc(0, 4096), 4096)
        t = threading.Thread(target=lambda: print(code(lambda: h.prepare(comm, 2)), flush=True))
        t.start(); time.sleep(0.5)
        print(code(lambda: h.bind(comm, other)), code(lambda: h.unbind(comm, tok)), code(lambda: h.destroy(comm)),
              flush=True)
        t.join()
        print(code(lambda: h.unbind(comm, tok)), code(lambda: h.destroy(comm)))
        """)
    assert out[:6] == ["4", "4", "4", "9", "ok", "ok"] and "while HcclCommPrepare runs" in out[-1]


def test_r15_a_prepare_meets_one_instance_of_the_name_once(sim_root, tmp_path) -> None:
    """HCCL knows the ends of a Prepare's connection by their addresses and the communicator's name only: rank 0's
    communicator meets rank 1's; destroyed and made anew under the same name, it finds rank 1's still alive -- but
    that one met its predecessor (one connection), so the new Prepare waits for a peer that never comes."""
    out = run(sim_root, tmp_path, """
        p, conn = peer()
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok)
        print(code(lambda: h.prepare(comm, 30)))
        h.unbind(comm, tok); h.destroy(comm)
        again = h.init_comm(TABLE, 0, CommConfig.make("t"))
        h.bind(again, tok)
        print(code(lambda: h.prepare(again, 1)))
        conn.recv(); conn.send("bye"); p.join()
        """)
    assert out == ["ok", "9"]   # met, then HCCL_E_TIMEOUT (not met by the instance its predecessor met)


def test_r16_a_transfer_goes_to_the_instance_its_prepare_met(sim_root, tmp_path) -> None:
    """Rank 1 destroys the communicator rank 0's met and makes one of the same name over the same memory, in its
    Prepare: rank 0's get, which moved bytes before, now fails -- its connection went with the instance it met."""
    out = run(sim_root, tmp_path, """
        import struct
        def swap_main(conn):
            other_server()
            a, h, buf, tok, comm, s = rank(1)
            h.bind(comm, tok); h.prepare(comm, 30)
            conn.send(buf); conn.recv()
            h.unbind(comm, tok); h.destroy(comm)
            again = h.init_comm(TABLE, 1, CommConfig.make("t"))
            h.bind(again, tok)
            threading.Thread(target=lambda: code(lambda: h.prepare(again, 5)), daemon=True).start()
            path, end = os.path.join(os.environ["ASCEND_SIM_DIR"], "comm-t-r1"), time.monotonic() + 30
            while time.monotonic() < end and struct.unpack_from("=ii", open(path, "rb").read())[1] != 1:
                time.sleep(0.01)   # until the new one's Prepare published its memory
            conn.send("swapped"); conn.recv()
        mine, theirs = mp.Pipe()
        p = mp.get_context("fork").Process(target=swap_main, args=(theirs,), daemon=True)
        p.start()
        a, h, buf, tok, comm, s = rank(0)
        h.bind(comm, tok); h.prepare(comm, 30)
        other = mine.recv()
        print(code(lambda: raw(h, False, comm, [buf], [other], [4096], s)))
        a.synchronize(0, s, 10000)
        mine.send("swap"); mine.recv()
        print(code(lambda: raw(h, False, comm, [buf], [other], [4096], s)))
        mine.send("bye"); p.join()
        """)
    assert out == ["ok", "19"]   # HCCL_E_NETWORK


def test_r17_the_rank_table_is_version_1_0_or_1_2(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        for v in ("1.1", "1.0"):
            print(code(lambda: h.init_comm(table(v), 0, CommConfig.make("t" + v))))
        """)
    assert out == ["1", "ok"]   # HCCL_E_PARA


def test_r18_device_ips_of_a_table_are_unique(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        print(code(lambda: h.init_comm(table(ips=(NICS[0], NICS[0])), 0, CommConfig.make("t"))))
        """)
    assert out[0] == "1" and "repeated" in out[-1]   # HCCL_E_PARA at init, naming the address


def test_r19_a_1_2_table_names_super_device_ids(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        print(code(lambda: h.init_comm(table("1.2"), 0, CommConfig.make("t"))),
              code(lambda: h.init_comm(table("1.2", sdids=("0", "16")), 0, CommConfig.make("u"))))
        """)
    assert out == ["1", "ok"]


def test_r20_the_device_ip_must_be_that_npus_nic_address(sim_root, tmp_path) -> None:
    """A table whose device ip for this rank is not its physical NPU's hccn.conf address: Prepare waits its timeout
    (1 s here) and fails; NPU 1's address on NPU 0 is no better. On an A3 the super device id is checked too."""
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        for n, ips in enumerate([("10.0.0.1", NICS[1]), ("192.168.100.102", NICS[1])]):
            comm = h.init_comm(table(ips=ips), 0, CommConfig.make(f"t{n}"))
            print(code(lambda: h.prepare(comm, 1)))
        """)
    assert out[:2] == ["9", "9"] and "no NIC of NPU 0 has address 10.0.0.1" in out[-1]   # HCCL_E_TIMEOUT
    a3 = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        comm = h.init_comm(table("1.2", sdids=("7", "16")), 0, CommConfig.make("t"))
        print(code(lambda: h.prepare(comm, 1)))
        """, ASCEND_SIM_SOC_VERSION="Ascend910_9391")
    assert a3 == ["4"]   # vNIC looked up by a super device id that is not the NPU's


def test_r21_a_1_0_table_fails_prepare_on_an_a3(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        print(a.soc_name())
        comm = h.init_comm(table("1.0"), 0, CommConfig.make("t"))
        print(code(lambda: h.prepare(comm, 1)))
        """, ASCEND_SIM_SOC_VERSION="Ascend910_9391")
    assert out == ["Ascend910_9391", "4"]   # at once, HCCL_E_INTERNAL (not the timeout's 9)


def test_r22_a_bound_range_over_64_gib_fails_prepare_not_its_registration(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        a.set_device(0)
        big = (64 << 30) + 4096
        buf = a.malloc(0, big)
        tok = h.register(MEM_DEVICE, buf, big)
        comm = h.init_comm(TABLE, 0, CommConfig.make("t"))
        h.bind(comm, tok)
        print(code(lambda: h.prepare(comm, 1)))
        """, ASCEND_SIM_HBM_MB=str(80 << 10))
    assert out == ["1"]   # registered and bound: refused at Prepare, HCCL_E_PARA


def test_r23_an_unknown_handle_is_hccl_e_para(sim_root, tmp_path) -> None:
    out = run(sim_root, tmp_path, """
        a, h = acl(), hccl()
        print(code(lambda: h.deregister(0x1234)))        # a thread with no device
        a.set_device(0)
        print(code(lambda: h.deregister(0x1234)))        # a handle this device's registry does not hold
        """)
    assert out == ["1", "1"]   # never HCCL_E_NOT_FOUND (6)


def test_r24_one_listener_per_nic_address_and_device_port(sim_root, tmp_path) -> None:
    """A second process whose communicator listens on NPU 0's NIC at the same port fails its Prepare; at another
    device_port it listens (and waits for its absent peer: the timeout)."""
    out = run(sim_root, tmp_path, """
        def holder(conn):
            a, h = acl(), hccl()
            a.set_device(0)
            comm = h.init_comm(table(), 0, CommConfig.make("x"))
            threading.Thread(target=lambda: code(lambda: h.prepare(comm, 30)), daemon=True).start()
            time.sleep(0.2)
            conn.send("listening"); conn.recv()
        mine, theirs = mp.Pipe()
        p = mp.get_context("fork").Process(target=holder, args=(theirs,), daemon=True)
        p.start(); mine.recv()
        a, h = acl(), hccl()
        a.set_device(0)
        for n, port in enumerate((None, 16667)):
            comm = h.init_comm(table(port=port), 0, CommConfig.make(f"t{n}"))
            print(code(lambda: h.prepare(comm, 1)))
        mine.send("bye"); p.join()
        """)
    assert out[:2] == ["19", "9"]   # HCCL_E_NETWORK; then the timeout (no peer), not the port


def test_r25_logical_devices_follow_ascend_rt_visible_devices(sim_root, tmp_path) -> None:
    """The decode worker of vllm-ascend's P/D example: logical 0-3 are physical 4-7; memory of logical 1 is on
    physical NPU 5 (the ledger); logical 4 does not exist."""
    out = run(sim_root, tmp_path, """
        a = acl()
        print(a.device_count(), [a.physical_id(i) for i in range(4)])
        print(code(lambda: a.set_device(4)))
        buf = a.malloc(1, 4096)
        line = [l for l in open(os.path.join(os.environ["ASCEND_SIM_DIR"], "ledger")) if f"{buf:#x}" in l][0]
        print(line.split()[1:3])
        """, ASCEND_RT_VISIBLE_DEVICES="4,5,6,7")
    assert out == ["4", "[4,", "5,", "6,", "7]", "107001", "['aclrtMalloc',", "'npu5']"]


def test_r26_a_key_its_exporter_closed_is_not_imported(sim_root, tmp_path) -> None:
    """The exporter's ``aclrtIpcMemClose`` destroys its key (runtime ``IpcCloseMemoryByName``: a name this process
    did not import goes to the driver's ``DestroyIpcMem``): it is no longer open, and importing it fails."""
    out = run(sim_root, tmp_path, """
        from tests.sim import open_export_keys
        a = acl()
        key = a.ipc_export(0, a.malloc(0, 4096), 4096)
        a.ipc_allow(0, key, [a.bare_tgid()])
        print(open_export_keys(os.environ["ASCEND_SIM_DIR"], os.getpid()) == [key])
        a.ipc_close(0, key)
        print(open_export_keys(os.environ["ASCEND_SIM_DIR"], os.getpid()) == [], code(lambda: a.ipc_import(0, key)))
        """)
    assert out == ["True", "True", "100000"]   # ACL_ERROR_INVALID_PARAM


def test_r27_the_transport_is_chosen_as_hcomm_chooses_it(sim_root, tmp_path) -> None:
    """hcomm ``IsUsedRdma`` (hccl_one_sided_service.cc): on an A2 two ranks of one server_id take HCCS -- over the
    vNIC, so a device ip that is not the NPU's NIC address does not matter (``HcclCommPrepare`` opens the NIC only
    for a RoCE peer) -- two server ids RoCE, and ``HCCL_INTRA_ROCE_ENABLE=1`` makes one server's pair RoCE, whose
    NIC is then opened by that address (R20: the timeout). On an A3 the super pod decides, not the server."""
    body = """
        from tests.sim import transports
        def pair(name, servers, ips, version="1.0", pods=("0", "0"), sdids=None):
            one = servers[0] == servers[1]
            t = table(version, ips=ips, servers=servers, pods=pods, sdids=sdids)
            def child(conn):
                if not one:
                    other_server()
                    os.environ["ASCEND_SIM_SUPER_DEVICE_BASE"] = "16"
                a, h = acl(), hccl()
                a.set_device(int(one))
                comm = h.init_comm(t, 1, CommConfig.make(name))
                conn.send(code(lambda: h.prepare(comm, 1)))
                conn.recv()
            mine, theirs = mp.Pipe()
            p = mp.get_context("fork").Process(target=child, args=(theirs,), daemon=True)
            p.start()
            a, h = acl(), hccl()
            a.set_device(0)
            comm = h.init_comm(t, 0, CommConfig.make(name))
            got = code(lambda: h.prepare(comm, 1)), mine.recv()
            print(got[0] + "/" + got[1], transports(os.environ["ASCEND_SIM_DIR"], os.getpid())[f"comm-{name}-r0"])
            mine.send("bye"); p.join()
        """
    out = run(sim_root, tmp_path, body + """
        same = (NICS[0], "192.168.100.102")
        pair("a", ("s0", "s0"), same)
        pair("b", ("s0", "s1"), (NICS[0], NICS[1]))
        pair("c", ("s0", "s0"), ("10.0.0.1", "192.168.100.102"))
        os.environ["HCCL_INTRA_ROCE_ENABLE"] = "1"
        pair("d", ("s0", "s0"), same)
        pair("e", ("s0", "s0"), ("10.0.0.1", "192.168.100.102"))
        """)
    assert out[:9] == ["ok/ok", "hccs", "ok/ok", "roce", "ok/ok", "hccs", "ok/ok", "roce", "9/9"], out
    assert "no NIC of NPU 0 has address 10.0.0.1" in out[-1]   # RoCE opens the NIC by the device ip (R20)
    a3 = run(sim_root, tmp_path, body + """
        pair("a", ("s0", "s1"), (NICS[0], NICS[1]), "1.2", ("0", "0"), ("0", "16"))
        pair("b", ("s0", "s1"), (NICS[0], NICS[1]), "1.2", ("0", "1"), ("0", "16"))
        """, ASCEND_SIM_SOC_VERSION="Ascend910_9391")
    assert a3 == ["ok/ok", "hccs", "ok/ok", "roce"], a3   # one super pod: HCCS across servers; two: RoCE


def test_every_mutation_finds_its_code() -> None:
    """The mutation checks (``python -m tests.sim.mutate_rules`` / ``mutate_transport``) run by hand; this keeps
    their tables in step with the sources they change (a moved or reworded line would make a check a no-op)."""
    from tests.sim import mutate_rules, mutate_transport

    for name, source, code, *_ in [*mutate_rules.MUTATIONS, *mutate_transport.MUTATIONS]:
        assert code in (ROOT / source).read_text(), f"{name}: its code is not in {source}"
