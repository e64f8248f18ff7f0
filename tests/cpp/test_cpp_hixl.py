"""The C++ hixl::Hixl (client/cpp, libcann_hixl.so): its copy of proto/datadist/hixl.py agrees with it; every method
and status code through two real daemons (tests/cpp/hixl_api_test.cc runs the checks, a test here starts the daemons
its scenario needs); and CANN's own HIXL samples -- fetched from the local mirror of hicann/hixl at test time only
when it exists (the repository keeps no copy) -- build unchanged with CANN's flags and run on the simulated ACL
runtime."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cpp import ROOT, compile_program, run_build
from tests.harness import ACL_PLANE, free_port

HERE = Path(__file__).resolve().parent
MIRROR = Path(os.environ.get("DATADIST_HIXL_MIRROR", "/work/.mirror/hicann+hixl/repo"))
CANN_FLAGS = ["-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0", "-ftrapv", "-O2", "-fno-common", "-Wfloat-equal", "-Wall",
              "-Werror", "-Wextra"]
ENGINES = ["127.0.0.1", "127.0.0.1:16000", "10.0.0.7:1", "10.0.0.7:65535", "10.0.0.7:65536", "10.0.0.7:0",
           "10.0.0.7:", "10.0.0.7:080", "010.0.0.7", "256.0.0.1", "host:1", "localhost", "", " 1.2.3.4",
           "[::1]", "[::1]:16000", "[::ffff:1.2.3.4]:9", "[1:0:0:2:0:0:0:3]", "[ABCD::00ef]:7", "[::1]x",
           "[::1]:", "::1", "[fe80::1%eth0]:5", "[1.2.3.4]:5", "1.2.3.4:5:6", "[::]"]


def test_cpp_wire_matches_hixl_py(tmp_path: Path) -> None:
    """hixl_wire.h's engine parsing, canonical form, cluster id and status map equal proto/datadist/hixl.py's."""
    from datadist import hixl
    from datadist.status import LLMStatusCode

    src = ROOT / "client" / "cpp"
    binary = tmp_path / "hixl_wire_test"
    run_build(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{src / 'include'}", f"-I{src / 'src'}",
           str(HERE / "hixl_wire_test.cc"), str(src / "src" / "hixl_wire.cc"), "-o", str(binary)],
          "compiling hixl_wire_test.cc", timeout=120)
    codes = [int(m) for m in LLMStatusCode] + [12345, -7]
    out = subprocess.run([str(binary), *map(str, codes)], input="\n".join(ENGINES) + "\n", capture_output=True,
                         text=True, check=True, timeout=30).stdout.splitlines()
    for text, line in zip(ENGINES, out[:len(ENGINES)], strict=True):
        _, canonical, cid = line.split("\t")
        try:
            engine = hixl.parse_engine(text)
        except ValueError:
            assert canonical == "ERR", (text, line)
            continue
        assert (canonical, int(cid)) == (engine.canonical, hixl.engine_cluster_id(engine)), text
    for code, line in zip(codes, out[len(ENGINES):], strict=True):
        assert int(line.split("\t")[1]) == hixl.hixl_status(code), code


SAMPLES = ["hixl_example_quickstart", "hixl_example_d2rd", "hixl_example_d2rd_multiproc", "hixl_example_d2rh"]


@pytest.fixture(scope="module")
def samples(cpp_install: Path, tmp_path_factory) -> dict[str, Path]:
    if not (MIRROR / "HEAD").exists():
        pytest.skip(f"no mirror of hicann/hixl at {MIRROR} (DATADIST_HIXL_MIRROR): CANN's samples are not kept here")
    from tests.sim import build
    sim = build()
    if sim is None:
        pytest.skip("no C compiler: the simulated Ascend runtime cannot be built")
    work = tmp_path_factory.mktemp("hixl-samples")
    env = {**os.environ, "PKG_CONFIG_PATH": str(cpp_install / "lib" / "pkgconfig")}
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "cann_hixl"], capture_output=True, text=True, env=env,
                        check=True).stdout.split()
    out = {}
    for name in SAMPLES:
        source = work / f"{name}.cpp"
        source.write_bytes(subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:examples/cpp/{name}.cpp"],
                                          capture_output=True, check=True).stdout)
        run_build(["g++", *CANN_FLAGS, f"-I{sim / 'include'}", str(source), "-o", str(work / name), *pc,
               f"-L{sim / 'lib64'}", f"-Wl,-rpath,{sim / 'lib64'}", "-lascendcl", "-lpthread", "-lrt"],
              f"compiling CANN's {name}.cpp")
        out[name] = work / name
    return out


@pytest.mark.parametrize("data_plane", [ACL_PLANE], indirect=True)
def test_canns_single_process_sample_d2rd(samples, data_plane, daemon_factory) -> None:
    """hixl_example_d2rd: two engines of one process (NPUs 0 and 2) on one acl daemon, a WRITE of 512 extents of
    16 KiB, verified by the sample itself."""
    daemon = daemon_factory.many("p")[0]
    env = {**os.environ, **{k: v for k, v in data_plane.items() if k.startswith("ASCEND_")},
           "DATADIST_DAEMON": daemon.target}
    r = subprocess.run([str(samples["hixl_example_d2rd"]), "--protocol=roce:device"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[INFO] Verify success" in r.stdout and "[INFO] Disconnect success" in r.stdout


#: where the two-process samples' servers hand out their buffer's address (quickstart: kSocketPort; d2rd_multiproc:
#: its server engine's port 16001 + 1000)
SAMPLE_PORT = 17001


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until something listens on TCP ``port`` (the kernel's table, /proc/net/tcp: a probe connection would be the
    sample's one accept); AssertionError when ``proc`` exits first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
        if any(r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows):
            return
        assert proc.poll() is None, f"the server exited ({proc.returncode}) before listening on {port}"
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on {port} within {timeout}s")


def _two(samples: dict[str, Path], name: str, data_plane: dict, daemons: list, args: list[str]) -> tuple:
    """``name`` as its server (on the first daemon, started first) and its client (on the second), each with its
    own args after ``--role=``; their (exit status, output) once both ended (bounded)."""
    env = {**os.environ, **{k: v for k, v in data_plane.items() if k.startswith("ASCEND_")}}
    server = subprocess.Popen([str(samples[name]), "--role=server", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**env, "DATADIST_DAEMON": daemons[0].target})
    try:
        _wait_listening(SAMPLE_PORT, server)   # the quickstart client connects once, with no retry
        client = subprocess.run([str(samples[name]), "--role=client", *args], capture_output=True, text=True,
                                env={**env, "DATADIST_DAEMON": daemons[1].target}, timeout=90)
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return (server.returncode, out), (client.returncode, client.stdout + client.stderr)


@pytest.mark.parametrize("data_plane", [ACL_PLANE], indirect=True)
def test_canns_two_process_samples_through_two_daemons(samples, data_plane, daemon_factory) -> None:
    """hixl_example_quickstart (a READ of 1 MiB) and hixl_example_d2rd_multiproc (a READ of 512 extents of 16 KiB),
    unchanged: the server on one acl daemon, the client on another (NPU memory by ACL IPC, bytes over HCCL); each
    side exits 0 and the client verifies what it read. The samples' own ports (16000, 16001, 17001) are fixed."""
    daemons = daemon_factory.many("p", "d")
    (code, out), (ccode, cout) = _two(samples, "hixl_example_quickstart", data_plane, daemons, [])
    assert code == 0 and ccode == 0, out + cout
    assert "[INFO] TransferSync READ completed" in cout and "[INFO] Verify success" in cout
    assert "[INFO] Server got done signal" in out
    (code, out), (ccode, cout) = _two(samples, "hixl_example_d2rd_multiproc", data_plane, daemons,
                                      ["--protocol=roce:device"])
    assert code == 0 and ccode == 0, out + cout
    assert "[INFO] Verify success" in cout and "[INFO] Disconnect success" in cout


@pytest.fixture(scope="module")
def hixl_api_test(cpp_install: Path, tmp_path_factory) -> Path:
    """hixl_api_test.cc built against the installed headers and libcann_hixl (pkg-config cann_hixl) with CANN's
    sample flag (the old libstdc++ ABI)."""
    out = tmp_path_factory.mktemp("hixl-api") / "hixl_api_test"
    return compile_program(HERE / "hixl_api_test.cc", out, "-D_GLIBCXX_USE_CXX11_ABI=0", "-pthread",
                           install=cpp_install, package="cann_hixl")


def _failures(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("FAIL")]


def test_cpp_hixl_every_method_between_two_daemons(hixl_api_test, daemon_factory) -> None:
    """hixl::Hixl's every method and status code, a server engine on one daemon and a client engine on another
    (tcp, host memory): Initialize's refusals, registrations, sync and async connections with their statuses,
    READ and WRITE of 10,000 extents byte-exact, refused extents moving nothing, 256 async requests from one thread
    with both GetTransferStatus forms, notifies, AutoConnect, GetCapability, calls on an uninitialized engine."""
    da, db = daemon_factory.many("a", "b")
    ports = [str(free_port()) for _ in range(3)]
    r = subprocess.run([str(hixl_api_test), "pair", da.target, db.target, *ports], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "DATADIST_CPP_LOG": "error"})
    assert r.returncode == 0 and not _failures(r.stdout), \
        f"{_failures(r.stdout)}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert r.stdout.count("\nok ") >= 150 and r.stdout.rstrip().endswith("ALL OK")
    # the library says why it refused
    assert "[hixl] [RegisterMem] failed, error code is PARAM_INVALID" in r.stderr


def test_cpp_hixl_killed_peer_fails_requests_in_flight(hixl_api_test, daemon_factory) -> None:
    """64 async READs in flight (the peer's daemon stopped, so none can finish) when the peer's daemon is SIGKILLed:
    each ends FAILED or TIMEOUT within its deadline, none stays WAITING; a later TransferSync fails."""
    da, db = daemon_factory.many("a", "b")
    proc = subprocess.Popen([str(hixl_api_test), "killed", da.target, db.target, str(free_port()), str(free_port())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "DATADIST_CPP_LOG": "error"})
    assert proc.stdout is not None and proc.stdin is not None
    try:
        lines: list[str] = []
        for step, sig in (("READY", signal.SIGSTOP), ("INFLIGHT", signal.SIGKILL)):
            for line in proc.stdout:
                lines.append(line)
                if line.strip() == step:
                    break
            assert lines and lines[-1].strip() == step, "".join(lines)
            da.proc.send_signal(sig)
            proc.stdin.write("go\n")
            proc.stdin.flush()
        da.proc.wait(timeout=10)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + out
    assert proc.returncode == 0 and not _failures(out), f"{_failures(out)}\n{out[-3000:]}\n{err[-3000:]}"
    assert "ok killed_all_failed_or_timeout" in out
