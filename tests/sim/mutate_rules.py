"""Each rule of the SIMULATED runtime taken out in turn (a one-line change to its source), and its test in
tests/unit/test_sim_rules.py run against that build: every one must fail (an assertion, not a build error).

    .venv/bin/python -m tests.sim.mutate_rules [r1 r2 ...]

Restores each source with ``git checkout`` after its run: run it on a clean tree, with no other test running (the
simulation is rebuilt from whatever sources are there)."""

from __future__ import annotations

import sys

from tests.sim.mutate import run_mutated

H, A = "tests/sim/hccl.c", "tests/sim/ascendcl.c"
#: (rule, source, the rule's code, the code without it)
MUTATIONS = [
    ("r1", H, "int leaving = seconds >= 0 && waited >= (double)seconds;",
     "int leaving = seconds >= 0 && waited * 1000 >= (double)seconds;"),
    ("r2", H, 'if (descNum > (uint32_t)env_long("ASCEND_SIM_MAX_DESC", 256)) return HCCL_E_PARA;', ""),
    ("r3", H, "    c->bound[c->nbound++] = h;\n",
     "    c->bound[c->nbound++] = h;\n"
     "    if (c->prepared) { c->enabled[c->nenabled++] = h->region; publish_locked(c); }\n"),
    ("r4", H, "if (sim_inside(r->addr, r->size, p, n)) return (char *)r->backing + (p - r->addr);",
     "(void)n;\n    if (sim_inside(r->addr, r->size, p, 1)) return (char *)r->backing + (p - r->addr);"),
    ("r5", H, "  if (c->prepared) { /* R5", "  if (0) { /* R5"),
    ("r6", H, "return d >= 0 && d < SIM_NO_DEVICE ? d : SIM_NO_DEVICE;", "(void)d; return 0;"),
    ("r7", H, "if (!g_registry[h->registry]) g_nic_epoch[h->registry]++;", ""),
    ("r8", H, "if (bound) return HCCL_E_PARA;", "(void)bound;"),
    ("r9", H, "if (o->device == c->device && strcmp(o->name, c->name) == 0) {", "if (0) {"),
    ("r10", H, "if (__atomic_fetch_add(&g_initing, 1, __ATOMIC_SEQ_CST) != 0) {",
     "if (__atomic_fetch_add(&g_initing, 1, __ATOMIC_SEQ_CST) != 0 && 0) {"),
    ("r11", H, "  } else if (simacl_enqueue(stream, run_copies, j)) {",
     "  } else if (ret != HCCL_SUCCESS) {\n    free(j);\n  } else if (simacl_enqueue(stream, run_copies, j)) {"),
    ("r12", A, "allowed |= rec.pids[i] == bare_tgid();", "allowed |= rec.pids[i] == (int32_t)getpid();"),
    ("r13", A, "  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL; /* R13 */\n", ""),
    ("r14", H, "  if (!__atomic_load_n(&c->preparing, __ATOMIC_SEQ_CST)) return 0;",
     "  if (c || call) return 0;"),
    ("r15", H, "if (h.prepared && kill(h.pid, 0) == 0 && !read_met(h.id, c->rank).id) {",
     "if (h.prepared && kill(h.pid, 0) == 0) {"),
    ("r16", H, "if (h.id != c->met[remoteRank]) { /* R16", "if (0) { /* R16"),
]
#: the node's rules (R17-R27)
MUTATIONS += [
    ("r17", H, "if (!v10 && !v12) return HCCL_E_PARA; /* R17 */", "(void)v10;"),
    ("r18", H, "if (devs[i].ip[0] && strcmp(devs[i].ip, devs[j].ip) == 0) {", "if (0) {"),
    ("r19", H, 'if (v12 && !devs[i].sdid[0]) return HCCL_E_PARA; /* R19: "super_device_id" is required */', ""),
    ("r20", H, "if (simacl_nic_address(c->device, nic, sizeof nic) || strcmp(nic, c->own_ip) != 0) { /* R20 */",
     "if (0) { /* R20 */"),
    ("r21", H, "if (simacl_is_a3() && !c->v12) return HCCL_E_INTERNAL; /* R21: a 1.0 table on an A3 */", ""),
    ("r22", H, "if (c->bound[i]->region.size > (64ull << 30)) return HCCL_E_PARA; /* R22: 64 GiB per range */",
     "continue;"),
    ("r23", H, "if (!pp) ret = HCCL_E_PARA; /* R6, R23", "if (!pp) ret = HCCL_E_NOT_FOUND; /* R6, R23"),
    ("r24", H, "if (owner && owner != me && kill(owner, 0) == 0) {", "if (0) {"),
    ("r25", A, 'const char *s = getenv("ASCEND_RT_VISIBLE_DEVICES");', "const char *s = NULL;"),
    ("r26", A, "  unlink(path); /* R26", "  (void)path; /* R26"),
    ("r27", H, "if (simacl_is_a2()) return intra || strcmp(c->servers[me], c->servers[peer]) != 0; /* R27 A2 */",
     "if (simacl_is_a2()) return 1; /* R27 A2 */"),
]


def main(only: list[str]) -> int:
    """Take each rule out in turn; the number of rules whose test did not fail with an assertion."""
    bad = 0
    for name, source, rule, without in MUTATIONS:
        if only and name not in only:
            continue
        run = run_mutated(name, source, rule, without, ["-x", "tests/unit/test_sim_rules.py", "-k", f"test_{name}_"],
                          timeout=300)
        built = "building the simulated" not in run.stdout
        ok = run.returncode != 0 and built and "assert" in run.stdout
        bad += not ok
        print(f"{name}: {'fails without its rule' if ok else 'DOES NOT FAIL (or the build broke)'}", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
