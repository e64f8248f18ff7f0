"""The embedded daemon's per-user peer secret: made once, mode 0600, shared by the user's workers, never trusted
when someone else could have read or planted it."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from datadistd.usersecret import UnsafeSecret, user_secret_file


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
