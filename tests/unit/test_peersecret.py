"""Peer secrets (``datadistd.ops.peersecret``): the per-user one made once, mode 0600, shared by the user's daemons,
embedded or not; one rule for every secret file, configured or per-user; which secret a daemon uses said without
saying it."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from datadistd.ops.config import DEV_SECRET, PeerSection
from datadistd.ops.peersecret import (
    PeerSecret,
    UnsafeSecret,
    peer_secret,
    refuse_public_when_shared,
    user_secret_file,
)


def test_made_once_private_and_shared(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    paths: list[str] = []
    threads = [threading.Thread(target=lambda: paths.append(user_secret_file(env))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(set(paths)) == 1 and len(paths) == 8
    st = os.stat(paths[0])
    assert stat.S_IMODE(st.st_mode) == 0o600 and len(open(paths[0]).read().strip()) == 64
    assert stat.S_IMODE(os.stat(tmp_path / "datadist").st_mode) == 0o700
    assert os.listdir(tmp_path / "datadist") == ["peer.secret"]          # no temporary file left behind


def test_config_home_when_no_runtime_dir(tmp_path):
    assert user_secret_file({"XDG_CONFIG_HOME": str(tmp_path)}) == str(tmp_path / "datadist" / "peer.secret")


@pytest.mark.parametrize("spoil", ["file-mode", "dir-mode", "symlink", "empty", "owner"])
def test_a_secret_others_could_read_or_plant_is_refused(tmp_path, spoil):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    path = user_secret_file(env)
    if spoil == "file-mode":
        os.chmod(path, 0o644)
    elif spoil == "dir-mode":
        os.chmod(tmp_path / "datadist", 0o755)
    elif spoil == "symlink":
        os.unlink(path)
        (tmp_path / "elsewhere").write_text("planted\n")
        os.symlink(tmp_path / "elsewhere", path)
    elif spoil == "owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file to another uid")
        os.chown(path, 65534, -1)
    else:
        open(path, "w").close()
    with pytest.raises(UnsafeSecret):
        user_secret_file(env)


# ---- one rule for every secret file (issue 37, item 4) ---------------------------------------------------------

def _configured(tmp_path, mode: int, text: str = "a-cluster-secret\n") -> str:
    path = tmp_path / "peer.secret"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
def test_a_configured_secret_file_others_may_read_or_change_is_refused_with_the_chmod(tmp_path, mode):
    path = _configured(tmp_path, mode)
    for embedded in (False, True):   # the same rule in every mode
        with pytest.raises(UnsafeSecret) as info:
            peer_secret(PeerSection(secret_file=path, dev_secret_fallback=not embedded))
        assert f"chmod 600 {path}" in str(info.value) and oct(mode)[2:] in str(info.value)


def test_a_private_configured_secret_file_is_read_through_a_link(tmp_path):
    path = _configured(tmp_path, 0o600, "a-cluster-secret\nignored second line\n")
    os.symlink(path, tmp_path / "link")     # e.g. a mounted secret's ..data link
    secret = peer_secret(PeerSection(secret_file=str(tmp_path / "link")))
    assert secret.value == b"a-cluster-secret" and secret.real
    assert secret.source == f"the secret file {tmp_path / 'link'}"


def test_a_configured_secret_file_of_another_user_or_empty_is_refused(tmp_path):
    path = _configured(tmp_path, 0o600, "\n")
    with pytest.raises(UnsafeSecret, match="is empty"):
        peer_secret(PeerSection(secret_file=path))
    with pytest.raises(UnsafeSecret, match="cannot open"):
        peer_secret(PeerSection(secret_file=str(tmp_path / "missing")))
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another uid")
    path = _configured(tmp_path, 0o600)
    os.chown(path, 65534, -1)
    with pytest.raises(UnsafeSecret, match=f"chown {os.geteuid()} {path}"):
        peer_secret(PeerSection(secret_file=path))


# ---- where the secret comes from, and how it is named -----------------------------------------------------------

def test_nothing_configured_is_the_per_user_secret_in_both_modes(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    daemon = peer_secret(PeerSection(), env=env)
    embedded = peer_secret(PeerSection(dev_secret_fallback=False), env=env)
    assert daemon == embedded and daemon.real
    assert daemon.source == f"the per-user secret {tmp_path / 'datadist' / 'peer.secret'}"


def test_without_a_place_for_it_only_an_opted_in_daemon_falls_back_to_the_public_secret():
    env = {"XDG_CONFIG_HOME": "/proc/datadist-none", "HOME": "/proc/datadist-none"}
    secret = peer_secret(PeerSection(dev_secret_fallback=True), env=env)
    assert secret.value == DEV_SECRET.encode() and not secret.real and "public development secret" in secret.source
    for peer in (PeerSection(), PeerSection(dev_secret_fallback=False)):   # the default: refuse, naming the fixes
        with pytest.raises(UnsafeSecret, match="DATADISTD_PEER_SECRET_FILE.*StateDirectory=datadist"):
            peer_secret(peer, env=env)
    assert not peer_secret(PeerSection(secret=DEV_SECRET)).real


def test_a_missing_home_is_never_made(tmp_path):
    home = tmp_path / "gone" / "home"
    with pytest.raises(UnsafeSecret, match=f"{home} does not exist"):
        peer_secret(PeerSection(), env={"HOME": str(home)})
    assert not (tmp_path / "gone").exists()
    home.mkdir(parents=True)          # an existing home gets its ~/.config/datadist
    secret = peer_secret(PeerSection(), env={"HOME": str(home)})
    assert secret.real and secret.source == f"the per-user secret {home / '.config' / 'datadist' / 'peer.secret'}"


def test_under_systemd_the_node_secret_is_made_in_the_state_directory(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {"STATE_DIRECTORY": f"{state}:{tmp_path / 'other'}", "XDG_RUNTIME_DIR": str(tmp_path)}
    first = peer_secret(PeerSection(), env=env)
    path = state / "peer.secret"
    assert first.real and first.source == f"the node secret {path}"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and os.stat(path).st_uid == os.geteuid()
    assert len(first.value) == 64 and peer_secret(PeerSection(), env=env) == first    # made once, then read
    assert not (tmp_path / "datadist").exists()                                        # not the per-user one
    assert peer_secret(PeerSection(secret="configured"), env=env).value == b"configured"   # configuration first
    state.chmod(0o750)
    with pytest.raises(UnsafeSecret, match=f"chmod 700 {state}"):
        peer_secret(PeerSection(), env=env)
    with pytest.raises(UnsafeSecret, match="StateDirectory="):
        peer_secret(PeerSection(), env={"STATE_DIRECTORY": str(tmp_path / "missing")})


def test_the_public_secret_never_serves_other_users():
    public = PeerSecret(DEV_SECRET.encode(), "the public development secret", False)
    for mode in (0o660, 0o640, 0o620):
        with pytest.raises(UnsafeSecret, match="serves other users.*secret_file"):
            refuse_public_when_shared(public, mode)
    refuse_public_when_shared(public, 0o600)                                   # a one-user daemon may
    refuse_public_when_shared(PeerSecret(b"real", "a file", True), 0o660)   # a real secret serves anyone


def test_a_secret_is_named_by_source_and_fingerprint_never_by_itself():
    a, b = (PeerSecret(value, "the [peer] secret", True) for value in (b"alpha-secret", b"bravo-secret"))
    assert a.fingerprint == PeerSecret(b"alpha-secret", "elsewhere", True).fingerprint   # the same secret: equal
    assert a.fingerprint != b.fingerprint and len(a.fingerprint) == 8
    for text in (a.describe(), repr(a)):
        assert "alpha-secret" not in text
    assert a.describe() == f"the [peer] secret (fingerprint {a.fingerprint})"
