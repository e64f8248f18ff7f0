"""The system service exactly as ``deploy/`` ships it, attacked by another local user (issue 44, attack 1).

The daemon runs as the unit's user would (a throwaway user in the daemon's group, no capability, the unit's umask),
with the shipped ``deploy/datadistd.toml`` installed as ``/etc/datadist/datadistd.toml`` would be, and the
environment systemd gives the unit: ``$RUNTIME_DIRECTORY`` and ``$STATE_DIRECTORY`` made with the unit's modes, and
the home ``deploy/datadist.sysusers.conf`` gives its user (``/``: no place for a per-user secret, as under
``ProtectHome=yes``). No systemd here runs the unit itself (this test reads what it needs from the unit file), so
what is checked is the daemon under the unit's configuration, not systemd's sandbox.

Alice, a tenant, serves a cache from a prompt engine listening on loopback. Eve, a local user outside the daemon's
group, links to it from her own embedded worker with the public development secret and with her own secret: both
refused, nothing pulled, and she cannot read the node secret. A worker given the node secret (as a second node is)
links and pulls: the listener is there, only the secret keeps Eve out.
"""

from __future__ import annotations

import configparser
import grp
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

from datadist.status import LLMStatusCode as S
from tests.daemonproc import free_port
from tests.harness import ROOT

from .test_local_links import WORKER, _line
from .test_users import users  # noqa: F401 - the throwaway-users fixture
from .users import GROUP, as_user, end, ids

pytestmark = pytest.mark.integration

DAEMON_USER = "ddtest-daemon"     # stands for the unit's User=datadist


def _unit() -> dict[str, str]:
    """The [Service] keys of deploy/datadistd.service this test follows."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str   # type: ignore[assignment,method-assign]
    parser.read(ROOT / "deploy" / "datadistd.service")
    return dict(parser["Service"])


def _sysusers_home() -> str:
    """The home deploy/datadist.sysusers.conf gives the daemon's user ('-': '/', as systemd-sysusers makes it)."""
    for line in (ROOT / "deploy" / "datadist.sysusers.conf").read_text().splitlines():
        if line.startswith("u "):
            home = line.rsplit(None, 2)[-2]
            return "/" if home == "-" else home
    raise AssertionError("no user in deploy/datadist.sysusers.conf")


@pytest.fixture
def shipped(users):  # noqa: F811
    """The daemon as the unit runs it; yields (its log path, its socket, its state directory)."""
    unit = _unit()
    assert unit["User"] == "datadist" and unit["Group"] == "datadist"
    assert "--config /etc/datadist/datadistd.toml" in unit["ExecStart"]
    uid, gid = ids(DAEMON_USER)
    base = tempfile.mkdtemp(prefix="datadist-shipped-")
    os.chmod(base, 0o711)
    etc = os.path.join(base, "etc-datadist")
    os.mkdir(etc, 0o755)
    config = os.path.join(etc, "datadistd.toml")          # install -m 0644 deploy/datadistd.toml /etc/datadist/
    shutil.copyfile(ROOT / "deploy" / "datadistd.toml", config)
    os.chmod(config, 0o644)
    dirs = {}
    for key in ("RuntimeDirectory", "StateDirectory"):      # systemd makes them, owned by User=, with their modes
        path = os.path.join(base, key)
        os.mkdir(path)
        os.chown(path, uid, gid)
        os.chmod(path, int(unit.get(f"{key}Mode", "0755"), 8))
        dirs[key] = path
    log_path = os.path.join(base, "daemon.log")
    env = {"HOME": _sysusers_home(), "USER": "datadist", "LOGNAME": "datadist",
           "RUNTIME_DIRECTORY": dirs["RuntimeDirectory"], "STATE_DIRECTORY": dirs["StateDirectory"]}
    with open(log_path, "wb") as log:
        proc = as_user(DAEMON_USER, ["-m", "datadistd", "--config", config], env=env, stdout=log, stderr=log,
                       umask=int(unit["UMask"], 8))
    sock = os.path.join(dirs["RuntimeDirectory"], "datadistd.sock")
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock + ".admin"):
            assert proc.poll() is None and time.monotonic() < deadline, open(log_path).read()
            time.sleep(0.1)
        yield log_path, sock, dirs["StateDirectory"]
    finally:
        end(proc)
        shutil.rmtree(base, ignore_errors=True)


def _finished(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_1_the_shipped_service_links_only_holders_of_its_node_secret(shipped):
    log_path, sock, state = shipped
    secret = os.path.join(state, "peer.secret")

    base = os.path.dirname(state)
    homes = {}
    for user in ("ddtest-alice", "ddtest-eve"):             # each worker's own runtime directory
        homes[user] = os.path.join(base, user)
        os.mkdir(homes[user], 0o700)
        os.chown(homes[user], *ids(user))
    port = free_port()
    prompt = as_user("ddtest-alice", ["-c", WORKER, "prompt", str(port), "1", "0"],
                     env={"DATADIST_DAEMON": f"unix://{sock}"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    try:
        assert _line(prompt) == {"ready": True}

        def decoder(user: str, cluster: int, env: dict[str, str]) -> dict:
            return _finished(as_user(user, ["-c", WORKER, "decoder", str(port), str(cluster), "1"],
                                     env={"XDG_RUNTIME_DIR": homes[user], **env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))

        # Eve, outside the daemon's group, from her own embedded worker: the public secret, then her own
        refused = {"link": int(S.LLM_LINK_FAILED), "pulled": None}
        assert decoder("ddtest-eve", 3, {"DATADISTD_PEER_SECRET": "datadist-development-secret"}) == refused
        assert decoder("ddtest-eve", 4, {}) == refused
        st = os.stat(secret)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == ids(DAEMON_USER)[0]
        said = open(log_path).read()
        assert f"peers authenticate with the node secret {secret}" in said, said
        assert "public development secret" not in said, said
        peek = as_user("ddtest-eve", ["-c", f"open({secret!r}).read()"], stderr=subprocess.PIPE, text=True)
        assert peek.wait(60) != 0 and "PermissionError" in peek.stderr.read()
        # a holder of the node secret (what a second node is given) links and pulls the bytes
        given = os.path.join(homes["ddtest-alice"], "node.secret")
        shutil.copyfile(secret, given)
        os.chown(given, *ids("ddtest-alice"))
        os.chmod(given, 0o600)
        assert decoder("ddtest-alice", 5, {"DATADISTD_PEER_SECRET_FILE": given}) == {"link": 0, "pulled": True}
        prompt.stdin.write("go\n")
        prompt.stdin.flush()
        assert _line(prompt) == {"untouched": True}
    finally:
        if prompt.poll() is None:
            prompt.stdin.close()
            try:
                prompt.wait(60)
            except subprocess.TimeoutExpired:
                prompt.kill()
    assert "refused a handshake from cluster 3 at 127.0.0.1: bad credential" in open(log_path).read()
    assert grp.getgrnam(GROUP).gr_gid not in os.getgrouplist("ddtest-eve", ids("ddtest-eve")[1])   # a stranger
