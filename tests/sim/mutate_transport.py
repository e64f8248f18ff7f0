# ruff: noqa: E501 - the table holds lines of source code as they are
"""Each of the hccl transport's CANN-order fixes (issue 33) reverted in turn (a small change to its source), and the
test that holds it run: every one must fail. Companion of ``tests.sim.mutate_rules`` (the simulation's rules).

    .venv/bin/python -m tests.sim.mutate_transport [name ...]

Restores each source with ``git checkout``: run it on a clean tree, alone."""

from __future__ import annotations

import sys

from tests.sim.mutate import run_mutated

AG = "server/datadistd/transport/hccl/agent.py"
#: (name, source, the fix's code, the code without it, the tests that hold it)
MUTATIONS = [
 ("desc64", "server/datadist_ascend/hccl.py", "DESCS_PER_CALL = 64", "DESCS_PER_CALL = 1 << 30",
  ["tests/integration/test_hccl_cann.py::test_scattered_blocks_both_ways_then_relink[acl-hccl]"]),
 ("initlock", AG, "                with _INIT_LOCK:\n", "                if True:\n",
  ["tests/integration/test_hccl_cann.py::test_two_engines_of_one_daemon_link_at_the_same_moment[acl-hccl]"]),
 ("abort", AG, "                self._hccl.batch(put, entry.comm, entry.remote_rank, local[:, 0], remote[:, 0], local[:, 1],\n                                 entry.stream)\n",
  "                try:\n                    self._hccl.batch(put, entry.comm, entry.remote_rank, local[:, 0], remote[:, 0], local[:, 1],\n                                     entry.stream)\n                except AscendError as exc:\n                    raise DataDistError(exc.status, str(exc)) from None\n",
  ["tests/unit/test_hccl_agent.py::test_a_batch_that_fails_half_way_is_aborted"]),
 ("settle-device", "server/datadist_ascend/globalmem.py", "                acl().set_device(rng.device)\n                hccl().deregister", "                hccl().deregister",
  ["tests/unit/test_hccl_agent.py::test_registry_deregisters_from_any_thread_once_no_link_binds_it"]),
 ("unbound-wait", "server/datadist_ascend/globalmem.py", "        if not rng.retired or rng.binds or self._ranges", "        if not rng.retired or self._ranges",
  ["tests/unit/test_hccl_agent.py::test_registry_deregisters_from_any_thread_once_no_link_binds_it"]),
 ("ipcclose-device", "server/datadist_ascend/acl.py", "        self.set_device(device)\n        self._call(\"aclrtIpcMemClose\"", "        self._call(\"aclrtIpcMemClose\"",
  ["tests/unit/test_hccl_agent.py::test_imported_memory_is_closed_from_a_thread_without_a_device"]),
 ("comm-per-link", AG, "                name = comm_name((self.name, peer[\"name\"]), entry.link)\n",
  "                name = comm_name((self.name, peer[\"name\"]), b\"\")\n",
  ["tests/unit/test_hccl_agent.py::test_a_relink_gets_a_communicator_of_its_own_and_the_old_one_goes_after_its_prepare",
   "tests/integration/test_hccl_cann.py::test_a_relink_after_a_failed_link_meets_only_its_own_communicators[acl-hccl]"]),
 ("link-one-agent", AG, "            if any(e.link == link for e in self._comms.values()):\n", "            if False:\n",
  ["tests/unit/test_hccl_agent.py::test_an_identity_of_another_agent_on_a_link_leaves_that_agents_communicator"]),
 ("meta-names-identity", "server/datadistd/transport/hccl/transport.py",
  "        if agent.identity_name(metadata) != name:   # before its communicator retires that agent's\n",
  "        if False:\n",
  ["tests/unit/test_hccl_agent.py::test_a_meta_whose_identity_names_another_agent_is_refused_before_it_touches_that_agents_link"]),
 ("smaller-token", AG, "            if stale is not None and stale.link < link and not (stale.ready.done() and stale.ready.exception()):\n",
  "            if False:\n",
  ["tests/unit/test_hccl_agent.py::test_two_links_made_at_once_reach_both_ends_in_either_order_and_keep_one_communicator"]),
 # "teardown-device" retired (issue 45): Acl.set_device asks the runtime (aclrtGetDevice) instead of a per-thread
 # cache, so the stream abort that starts the teardown puts the thread on the engine's device whatever user code did;
 # without the teardown's own set_device nothing observable changes (test_unlink_sets_the_engines_device_whatever_
 # the_thread_says still holds the behaviour; "set-device-once" below holds the query).
 ("bare-tgid", "server/datadistd/api/attachmsgs.py", "                pid = msg.bare_tgid\n", "                pass\n",
  ["tests/integration/test_hccl_cann.py::test_scattered_blocks_both_ways_then_relink[acl-hccl]"]),
 ("split", AG, "            local, remote, outside = split_extents(local, remote, mine, entry.theirs)\n", "            outside = None\n",
  ["tests/integration/test_hccl_cann.py::test_memory_registered_after_the_link_needs_a_relink[acl-hccl]"]),
 ("bare-tgid-kernel", "server/datadistd/api/attachmsgs.py", "if isinstance(backend, DeviceBackend) and not backend.pid_is_bare_tgid and msg.bare_tgid > 0:",
  "if isinstance(backend, DeviceBackend) and msg.bare_tgid > 0:",
  ["tests/security/test_npu.py::test_a_pool_key_names_the_kernels_pid_where_it_is_the_drivers[acl-hccl]"]),
 ("unlink-waits", AG, "        entry.stop = True\n        if entry.opening.acquire(blocking=False):",
  "        entry.stop = True\n        if True:\n            with entry.lock:\n                self._teardown(entry)\n            return\n        if entry.opening.acquire(blocking=False):",
  ["tests/unit/test_hccl_agent.py::test_a_relink_gets_a_communicator_of_its_own_and_the_old_one_goes_after_its_prepare"]),
]
#: issue 45's fixes (the node: physical ids, NIC addresses, the chip's table, memory freed after HCCL)
MUTATIONS += [
 ("physical-id", "server/datadistd/node/node.py", "            return self.backend.local_device(options.npu)", "            return options.npu",
  ["tests/integration/test_npus.py::test_visible_devices_pair_linked_inside_one_daemon[acl-hccl]"]),
 ("device-ip-check", AG, '        check_device_ip(self._identity["device_ip"], self._ip_source, self.physical, peer["device_ip"])\n', "",
  ["tests/unit/test_hccl_agent.py::test_a_device_ip_hccl_could_only_fail_on_is_refused_before_hccl"]),
 ("table-1.2", "server/datadistd/transport/hccl/identity.py", '    v12 = all(m.get("super_device_id") and m.get("super_pod_id") for m in members)', "    v12 = False",
  ["tests/integration/test_npus.py::test_an_a3_pair_links_with_a_1_2_rank_table[acl-hccl]"]),
 ("range-users", "server/datadist_ascend/globalmem.py", "                rng.users += 1", "                pass",
  ["tests/unit/test_hccl_agent.py::test_memory_is_freed_only_once_hccl_let_it_go_and_by_its_last_user"]),
 ("set-device-once", "server/datadist_ascend/acl.py", "        if self.current() != device:\n            self._call(\"aclrtSetDevice\", device)", "        self._call(\"aclrtSetDevice\", device)",
  ["tests/unit/test_ascend.py::test_a_thread_sets_its_device_once_and_a_workers_thread_keeps_its_own"]),
]
def main(only: list[str]) -> int:
    bad = 0
    for name, source, fix, without, tests in MUTATIONS:
        if only and name not in only:
            continue
        run = run_mutated(name, source, fix, without, tests, timeout=600)
        bad += run.returncode == 0
        print(f"{name}: {'fails without the fix' if run.returncode else 'DOES NOT FAIL'}", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
