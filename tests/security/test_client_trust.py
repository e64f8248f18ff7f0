"""Clients check whose socket they reached (issue 44, attack 2).

* Another local user creates ``/tmp/datadist-<victim uid>/`` -- the default socket directory of the victim's daemon
  when it does not run as root -- and listens there (root only: throwaway users, skipped with the reason otherwise).
  The victim's Python and C++ workers refuse at attach, naming the socket, the uid found and the fix; the squatter
  is sent nothing: no hello, no call, no descriptor, no byte.
* A fake daemon of the worker's own uid (tests/hostile_daemon.py) hands over an unsealed pool it then shrinks, a
  tensor past the pool's end, a tensor shorter than the cache's description: the Python client refuses each with
  LLM_FAILED and nothing crashes (the C++ client's side, under the sanitizers: tests/cpp/test_cpp_hostile.py).
* The rule itself (``datadist.sockdir.culprit``): a directory of another uid right inside ``/tmp`` vouches for
  nothing; one that root made for that uid does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from datadist import sockdir
from datadist.status import LLMStatusCode as S
from tests import hostile_daemon
from tests.harness import ROOT

from .test_users import users  # noqa: F401 - the throwaway-users fixture
from .users import as_user, ids

pytestmark = pytest.mark.integration

#: names of this module's own throwaway users (other tests make ddtest-* users at the same time)
SQUATTER, VICTIM = "ddtest-squat", "ddtest-squatvic"

WORKER = """
import sys, llm_datadist as ld
from llm_datadist import views
cfg = ld.LLMConfig(); cfg.device_id = 0; cfg.enable_cache_manager = True
cfg.mem_pool_cfg = '{"memory_size": 1048576}'
dd = ld.LLMDataDist(ld.LLMRole.DECODER, 1)
try:
    dd.init(cfg.generate_options())
except ld.LLMException as e:
    print("init", int(e.status_code), e, flush=True); sys.exit(0)
print("init 0", flush=True)
try:
    own = dd.cache_manager.allocate_blocks_cache(ld.CacheDesc(2, [8, 4096], ld.DataType.DT_UINT8))
except ld.LLMException as e:
    print("allocate", int(e.status_code), e, flush=True)
else:
    print("allocate 0", flush=True)
    k, v = views.numpy_views(own); k[:] = 3; v[:] = 3
    print("touched", flush=True)
dd.finalize()
"""


def _worker(target: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DATADIST_DAEMON": target})


@pytest.mark.parametrize("mode", ["unsealed", "past_end", "short"])
def test_python_client_refuses_a_hostile_daemon(tmp_path, mode) -> None:
    """Without the checks the worker dies of SIGBUS (unsealed: the pool shrunk under its mapping) or SIGSEGV
    (short: the cache's views run past the pool)."""
    sock, report = str(tmp_path / "d" / "datadistd.sock"), str(tmp_path / "report.jsonl")
    proc = hostile_daemon.start(sock, mode, report)
    try:
        r = _worker(f"unix://{sock}")
    finally:
        hostile_daemon.stop(proc)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "init 0" in r.stdout and f"allocate {int(S.LLM_FAILED)}" in r.stdout and "touched" not in r.stdout, \
        r.stdout + r.stderr[-3000:]
    why = {"unsealed": "not sealed against shrinking and growing", "past_end": "is outside pool",
           "short": "tensor 1 is 4096 bytes where the description makes 32768"}[mode]
    assert why in r.stdout, r.stdout


def test_python_client_takes_an_honest_fake(tmp_path) -> None:
    """The control: the fake answering as a daemon would is taken and the cache written."""
    sock, report = str(tmp_path / "d" / "datadistd.sock"), str(tmp_path / "report.jsonl")
    proc = hostile_daemon.start(sock, "honest", report)
    try:
        r = _worker(f"unix://{sock}")
    finally:
        hostile_daemon.stop(proc)
    assert "allocate 0" in r.stdout and "touched" in r.stdout, r.stdout + r.stderr[-3000:]


# ---- the rule ----------------------------------------------------------------------------------------------------

def test_a_directory_in_tmp_vouches_only_for_roots_entries(tmp_path) -> None:
    """As the daemon checks its own directory, /tmp is fine; for a client trusting another uid, that uid's
    directory right inside /tmp is not (anyone could have made it first), one inside a directory root made is."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make directories of another uid")
    other = 65534
    squatted = Path(tempfile.mkdtemp(prefix="datadist-rule-"))       # in /tmp, as /tmp/datadist-<uid> would be
    given = Path(tempfile.mkdtemp(prefix="datadist-rule-root-"))
    try:
        os.chown(squatted, other, other)
        os.chmod(squatted, 0o755)
        os.chmod(given, 0o755)                                          # root's, in /tmp
        (given / "run").mkdir(mode=0o750)
        os.chown(given / "run", other, other)
        assert sockdir.culprit(str(squatted), other) is None            # the daemon's own check passes it
        why = sockdir.culprit(str(squatted), other, given=True)
        assert why == f"{squatted} of uid {other} is inside {squatted.parent}, where every user may create names"
        assert sockdir.culprit(str(given / "run"), other, given=True) is None
        assert "is inside" in (sockdir.culprit(str(squatted.parent), other, given=True) or "")   # a socket in /tmp
        assert "owned by uid 65534" in (sockdir.culprit(str(given / "run"), 1234, given=True) or "")
    finally:
        shutil.rmtree(squatted)
        shutil.rmtree(given)


def test_a_link_in_tmp_does_not_pass_for_its_target(tmp_path) -> None:
    """A link another uid made in /tmp is a name it took there, whatever its target: the rule walks the path as
    named as well as the one it resolves to (without that, ``/tmp/datadist-<victim>`` -> a directory of the
    squatter's own inside one root made passed)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make directories and links of another uid")
    other = 65534
    given = Path(tempfile.mkdtemp(prefix="datadist-rule-root-"))
    link = Path(tempfile.mkdtemp(prefix="datadist-rule-link-"))
    try:
        os.chmod(given, 0o755)
        (given / "run").mkdir(mode=0o750)
        os.chown(given / "run", other, other)
        link.rmdir()
        link.symlink_to(given / "run")
        os.lchown(link, other, other)
        assert sockdir.culprit(str(given / "run"), other, given=True) is None     # the target alone passes
        why = sockdir.culprit(str(link), other, given=True)
        assert why == f"{link} of uid {other} is inside {link.parent}, where every user may create names"
        assert f"{link} is a link owned by uid {other}" == sockdir.culprit(str(link), 1234)   # nor for the daemon
        os.lchown(link, 0, 0)                                  # root's link (as /var/run -> /run) vouches as root
        assert sockdir.culprit(str(link), other, given=True) is None
        # /tmp itself a (root's) link to a sticky directory every user may create names in: the squatter's link is
        # inside the directory it names, not inside a link
        shared = given / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        (given / "tmp").symlink_to(shared)
        (shared / "squat").symlink_to(given / "run")
        os.lchown(shared / "squat", other, other)
        why = sockdir.culprit(str(given / "tmp" / "squat"), other, given=True)
        assert why == f"{given / 'tmp' / 'squat'} of uid {other} is inside {given / 'tmp'}, where every user may " \
                      "create names", why
    finally:
        if link.is_symlink():
            link.unlink()
        shutil.rmtree(given)


# ---- another user squats the victim's socket directory (root only) ----------------------------------------------

@pytest.fixture(scope="module")
def squat_users(users):  # noqa: F811 - the throwaway users, made by test_users' fixture
    return ids(SQUATTER)[0], ids(VICTIM)[0]


def _squat(victim_uid: int, *more: str, linked: bool = False):  # noqa: ANN202 - a generator of (socket, report)
    """``linked``: /tmp/datadist-<victim> is the squatter's link to a directory of its own inside one root made."""
    directory = f"/tmp/datadist-{victim_uid}"
    if os.path.islink(directory):
        os.unlink(directory)
    shutil.rmtree(directory, ignore_errors=True)          # a directory an earlier run left
    base = None
    if linked:
        base = tempfile.mkdtemp(prefix="datadist-squat-own-")
        os.chmod(base, 0o755)
        os.mkdir(os.path.join(base, "run"), 0o755)
        os.chown(os.path.join(base, "run"), *ids(SQUATTER))
        os.symlink(os.path.join(base, "run"), directory)
        os.lchown(directory, *ids(SQUATTER))
    sock, report = f"{directory}/datadistd.sock", f"{directory}/report.jsonl"
    proc = as_user(SQUATTER, [str(ROOT / "tests" / "hostile_daemon.py"),
                              *hostile_daemon.argv(sock, "honest", report, *more)],
                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        hostile_daemon.wait_ready(proc)
        assert os.stat(directory).st_uid == ids(SQUATTER)[0]
        yield sock, report
    finally:
        hostile_daemon.stop(proc)
        if os.path.islink(directory):
            os.unlink(directory)
        shutil.rmtree(directory, ignore_errors=True)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["directory", "link"])
def squatted(squat_users, request):
    """The squatter's fake daemon on the victim's default socket, in the directory it made (or behind the link it
    made there to a directory of its own): (socket, report)."""
    yield from _squat(squat_users[1], linked=request.param == "link")


def _refused(out: str, sock: str, daemon_uid: int, why: str = "where every user may create names") -> None:
    assert f"refusing the daemon socket {sock}.attach: it is served by uid {daemon_uid}" in out, out
    assert why in out and "Fix: remove the directory" in out, out


def test_python_worker_refuses_a_squatted_socket_directory(squat_users, squatted) -> None:
    squatter_uid, _ = squat_users
    sock, report = squatted
    victim = as_user(VICTIM, ["-c", WORKER], env={"DATADIST_DAEMON": f"unix://{sock}"}, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    out, err = victim.communicate(timeout=60)
    assert victim.returncode == 0 and out.startswith(f"init {int(S.LLM_FAILED)} "), out + err[-3000:]
    _refused(out, sock, squatter_uid)
    assert hostile_daemon.events(report) == []            # no hello, no call, no descriptor, no byte


@pytest.mark.timeout(1200)      # may wait for the library's build (make cpp), as the tests of tests/cpp do
def test_cpp_worker_refuses_a_squatted_socket_directory(squat_users, squatted) -> None:
    from tests.cpp import compile_program, make_cpp, toolchain_missing

    why = toolchain_missing()
    if why:
        if os.environ.get("DATADIST_CI_CPP") == "1":     # CI installs the toolchain (tests/cpp/conftest.py)
            pytest.fail(f"the C++ client cannot be built: {why}")
        pytest.skip(f"the C++ client's toolchain is not installed: {why}")
    squatter_uid, _ = squat_users
    sock, report = squatted
    make_cpp(timeout=1140)
    out_dir = Path(tempfile.mkdtemp(prefix="datadist-squat-cpp-"))
    try:
        os.chmod(out_dir, 0o755)                            # the victim user runs it
        binary = compile_program(ROOT / "tests" / "cpp" / "hostile_test.cc", out_dir / "hostile_test", "-pthread")
        uid, gid = ids(VICTIM)
        r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--inh-caps=-all",
                            "--bounding-set=-all", "--no-new-privs", str(binary), f"unix://{sock}"],
                           capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    finally:
        shutil.rmtree(out_dir)
    assert r.returncode == 0 and "initialize 0xFFFFFFFF" in r.stdout, r.stdout + r.stderr[-3000:]
    _refused(r.stderr, sock, squatter_uid)
    assert hostile_daemon.events(report) == []



def test_a_squatted_directory_linking_to_a_real_daemon_gets_no_calls(squat_users, daemon_factory) -> None:
    """The squatter's ``datadistd.sock.attach`` is a link to a real daemon's (run by root, here the worker's own
    uid): the kernel's uid is root's, but the directory is the squatter's, so the worker refuses before its gRPC
    calls -- and the capability they carry -- reach the squatter's listener beside the link."""
    real = daemon_factory("d")
    squatter_uid, victim_uid = squat_users
    squat = _squat(victim_uid, "--attach-to", real.socket + ".attach")
    sock, report = next(squat)
    try:
        r = _worker(f"unix://{sock}")
        assert r.returncode == 0 and r.stdout.startswith(f"init {int(S.LLM_FAILED)} "), r.stdout + r.stderr[-3000:]
        _refused(r.stdout, sock, 0, f"/tmp/datadist-{victim_uid} is owned by uid {squatter_uid}")
        assert hostile_daemon.events(report) == []
    finally:
        squat.close()
