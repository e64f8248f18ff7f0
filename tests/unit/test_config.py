from __future__ import annotations

import logging
from pathlib import Path

import pytest

from datadistd.ops.config import RETIRED_KEYS, Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_annotated_default_config_matches_the_code_defaults() -> None:
    from_file = load_config(ROOT / "deploy" / "datadistd.toml", env={})
    defaults = load_config(env={})
    assert from_file == defaults


def test_every_field_is_documented_in_code_and_in_the_deploy_file() -> None:
    import dataclasses

    text = (ROOT / "deploy" / "datadistd.toml").read_text()
    for section in dataclasses.fields(Config):
        assert f"[{section.name}]" in text
        kind = section.type if isinstance(section.type, type) else getattr(Config(), section.name)
        for f in dataclasses.fields(kind):
            assert f.metadata.get("doc"), f"{section.name}.{f.name} has no doc"
            assert f.name in text, f"{section.name}.{f.name} missing from deploy/datadistd.toml"


def test_precedence_file_env_overrides(tmp_path: Path) -> None:
    cfg_file = tmp_path / "d.toml"
    cfg_file.write_text('[transport]\nstreams = 2\nname = "tcp"\n[daemon]\nlog_level = "DEBUG"\n')
    cfg = load_config(cfg_file, env={"DATADISTD_TRANSPORT_STREAMS": "6"}, overrides={"daemon.log_level": "ERROR"})
    assert cfg.transport.streams == 6
    assert cfg.daemon.log_level == "ERROR"


@pytest.mark.parametrize("content,needle", [
    ("[nope]\nx = 1\n", "unknown config section"),
    ("[daemon]\nbogus = 1\n", "unknown config key 'daemon.bogus'"),
    ("[transport]\nstreams = \"many\"\n", "expected int"),
    ("[daemon\n", "config file"),
])
def test_bad_config_is_a_clear_error(tmp_path: Path, content: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_config(p, env={})
    assert needle in str(info.value)


@pytest.mark.parametrize("name,value,needle", [
    ("DATADISTD_DAEMON_DRAIN_SECONDS", "-1", "daemon.drain_seconds: expected a number of seconds, 0 or more; got -1.0"),
    ("DATADISTD_TRANSPORT_CONNECT_TIMEOUT_SECONDS", "nan", "transport.connect_timeout_seconds"),
    ("DATADISTD_PEER_HEARTBEAT_SECONDS", "0", "peer.heartbeat_seconds: expected a number of seconds, more than 0"),
])
def test_durations_are_never_negative(name: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={name: value})
    assert needle in str(info.value)
    assert load_config(env={"DATADISTD_DAEMON_DRAIN_SECONDS": "0"}).daemon.drain_seconds == 0


def test_data_ports_are_a_port_or_a_range_and_bind_only_reachable_listeners() -> None:
    assert load_config(env={}).transport.data_port_range() is None                 # default: the kernel picks
    cfg = load_config(env={"DATADISTD_TRANSPORT_DATA_PORTS": "26100-26115"})
    assert cfg.transport.data_port_range() == (26100, 26115)
    assert cfg.transport.settings("10.0.0.5")["ports"] == (26100, 26115)
    assert cfg.transport.settings("127.0.0.1")["ports"] is None                    # loopback: nobody else reaches it
    assert load_config(env={"DATADISTD_TRANSPORT_DATA_PORTS": "26100"}).transport.data_port_range() == (26100, 26100)
    for bad in ("26115-26100", "0", "http", "26100-70000"):
        with pytest.raises(ConfigError, match="transport.data_ports"):
            load_config(env={"DATADISTD_TRANSPORT_DATA_PORTS": bad})


def test_tls_needs_its_three_files() -> None:
    with pytest.raises(ConfigError, match="tls.enabled needs tls.key_file, tls.ca_file"):
        load_config(env={"DATADISTD_TLS_ENABLED": "yes", "DATADISTD_TLS_CERT_FILE": "/etc/datadist/node.pem"})
    cfg = load_config(env={"DATADISTD_TLS_ENABLED": "on", "DATADISTD_TLS_CERT_FILE": "c", "DATADISTD_TLS_KEY_FILE": "k",
                           "DATADISTD_TLS_CA_FILE": "a"})
    assert (cfg.tls.enabled, cfg.tls.cert_file, cfg.tls.key_file, cfg.tls.ca_file) == (True, "c", "k", "a")
    assert not load_config(env={}).tls.enabled


def test_bad_env_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="DATADISTD|transport.streams"):
        load_config(env={"DATADISTD_TRANSPORT_STREAMS": "x"})


def test_an_unknown_transport_stops_the_start() -> None:
    import pytest

    from datadistd.ops.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="known: hccl, nixl, tcp"):
        load_config(env={"DATADISTD_TRANSPORT_NAME": "local"})


def test_nixl_needs_the_operators_word_that_the_fabric_is_trusted(monkeypatch) -> None:
    """NIXL's backends authenticate nobody: nixl does not start on a default config, and names the fix."""
    import importlib.util

    import pytest

    from datadistd.ops.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="nixl_fabric_trusted = true"):
        load_config(env={"DATADISTD_TRANSPORT_NAME": "nixl"})
    trusted = {"DATADISTD_TRANSPORT_NAME": "nixl", "DATADISTD_TRANSPORT_NIXL_FABRIC_TRUSTED": "true"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)   # as on a host without the wheel
    with pytest.raises(ConfigError, match="pip install --no-deps nixl-cu12"):
        load_config(env=trusted)


def test_hccl_settings_take_the_engines_cann_options_over_the_daemons() -> None:
    """Per engine: its NPU, its llm.LocalCommRes address, traffic class, service level, retries and link time;
    the daemon's [transport] hccl_* fill what the engine leaves unset (device IPs listed by physical id, picked by the
    transport, which knows the NPU's physical id)."""
    from datadistd.core.options import parse_options
    from datadistd.core.types import Role
    from datadistd.ops.config import load_config

    cfg = load_config(env={"DATADISTD_TRANSPORT_NAME": "hccl", "DATADISTD_TRANSPORT_HCCL_DEVICE_IP":
                           "10.0.0.1, 10.0.0.2,10.0.0.3", "DATADISTD_TRANSPORT_HCCL_RDMA_TRAFFIC_CLASS": "100"})
    plain = cfg.transport.settings("127.0.0.1", 1, parse_options(Role.PROMPT, 1, {"ge.exec.deviceId": "1"}))
    assert (plain["device_id"], plain["device_ip"], plain["traffic_class"], plain["service_level"],
            plain["retries"], plain["prepare_timeout"], plain["physical_id"]) == (1, "", 100, -1, 1, 10.0, -1)
    assert (plain["device_ips"], plain["hccn_conf"], plain["device_port"]) == \
        ("10.0.0.1, 10.0.0.2,10.0.0.3", "/etc/hccn.conf", 16667)
    assert cfg.transport.device_ip(1) == "10.0.0.2"
    table = ('{"version": "1.0", "server_list": [{"server_id": "n1", "device": [{"device_id": "6", '
             '"device_ip": "10.9.9.9"}]}]}')
    own = cfg.transport.settings("127.0.0.1", 2, parse_options(Role.PROMPT, 1, {
        "llm.LocalCommRes": table, "llm.RdmaTrafficClass": "0", "llm.RdmaServiceLevel": "3",
        "llm.LinkRetryCount": "5", "llm.LinkTotalTime": "40"}))
    assert (own["device_ip"], own["server_id"], own["physical_id"], own["traffic_class"], own["service_level"],
            own["retries"], own["prepare_timeout"]) == ("10.9.9.9", "n1", 6, 0, 3, 5, 40.0)
    assert cfg.transport.device_ip(7) == ""   # a list without that device: the data plane's host address


def test_an_unknown_environment_variable_is_an_error_naming_the_nearest_known_one() -> None:
    """A misspelt section is refused like a misspelt key, never ignored (issue 37, item 3); the value (perhaps a
    secret) is not repeated."""
    for name, nearest in (("DATADISTD_METRIC_LISTEN", "DATADISTD_METRICS_LISTEN"),
                          ("DATADISTD_PEER_SECRET_FIEL", "DATADISTD_PEER_SECRET_FILE"),
                          ("DATADISTD_TRANSPORTS_NAME", "DATADISTD_TRANSPORT_NAME")):
        with pytest.raises(ConfigError) as info:
            load_config(env={name: "value-not-shown"})
        assert f"unknown environment variable {name} (did you mean {nearest}?)" in str(info.value)
        assert "value-not-shown" not in str(info.value)
    with pytest.raises(ConfigError, match="unknown environment variable DATADISTD_XYZZY;"):
        load_config(env={"DATADISTD_XYZZY": "1"})
    assert load_config(env={"DATADISTD_METRICS_LISTEN": "9400", "DATADIST_DAEMON": "/x", "DATADISTX": "1"})


def test_the_daemon_exits_2_on_an_unknown_environment_variable() -> None:
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", "/nonexistent/x.sock"],
                          env={**os.environ, "DATADISTD_METRIC_LISTEN": "9400"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr[-500:]
    assert "DATADISTD_METRIC_LISTEN (did you mean DATADISTD_METRICS_LISTEN?)" in done.stderr


def test_an_unknown_memory_backend_is_refused_naming_the_known_ones() -> None:
    """memory.backend is checked at load (a removed name such as cuda): exit 2 and the list, not a traceback."""
    import os
    import subprocess
    import sys

    with pytest.raises(ConfigError, match=r"memory.backend: unknown memory backend 'cuda'; known: acl, host"):
        load_config(env={"DATADISTD_MEMORY_BACKEND": "cuda"})
    assert load_config(env={"DATADISTD_MEMORY_BACKEND": "acl"}).memory.backend == "acl"
    done = subprocess.run([sys.executable, "-m", "datadistd", "--backend", "cuda", "--socket", "/nonexistent/x.sock"],
                          env={k: v for k, v in os.environ.items() if not k.startswith("DATADISTD_")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-500:]
    assert "unknown memory backend 'cuda'; known: acl, host" in done.stderr and "Traceback" not in done.stderr


def test_the_removed_session_keepalive_key_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'daemon.session_keepalive_seconds'"):
        load_config(overrides={"daemon.session_keepalive_seconds": 5.0}, env={})


@pytest.mark.parametrize("dotted", sorted(RETIRED_KEYS))
def test_a_key_the_daemon_does_not_read_loads_with_a_warning(tmp_path, caplog, dotted) -> None:
    """An old file, variable or flag setting a retired key still loads (every other unknown key is refused),
    warning that the key is ignored; the config has no such key."""
    section, key = dotted.split(".")
    path = tmp_path / "old.toml"
    path.write_text(f"[{section}]\n{key} = 300\n")
    env = {f"DATADISTD_{section}_{key}".upper(): "300"}
    with caplog.at_level(logging.WARNING, logger="datadistd.ops.config"):
        for cfg in (load_config(path, env={}), load_config(env=env), load_config(overrides={dotted: 300}, env={})):
            assert not hasattr(getattr(cfg, section), key)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all(f"config key {dotted} is not read" in w and "remove it" in w for w in warned)


def test_every_daemon_variable_the_tree_names_is_known() -> None:
    """What the docs, deploy files, tests and bench set is accepted: none is refused by the rule above."""
    import re

    from datadistd.ops.config import env_names

    known = env_names()
    placeholders = {"DATADISTD_SECTION_KEY", "DATADISTD_EXECUTABLE"}   # a pattern; check.sh's argument name
    found: dict[str, str] = {}
    for top in ("README.md", "docs", "deploy", "tests", "bench", "server", "client", "Makefile", ".ci"):
        for path in ([ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in ("", ".md", ".py", ".toml", ".sh", ".service", ".conf", ".cfg") \
                    and path != Path(__file__):   # this file misspells some on purpose
                # (a quoted refusal, "unknown environment variable X", is not a use of X)
                text = path.read_text(errors="replace")
                for name in re.findall(r"(?<!unknown environment variable )DATADISTD_[A-Z0-9_]+", text):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {name: where for name, where in found.items()
               if name not in known and name not in placeholders and not name.endswith("_")}
    assert not unknown, unknown
    assert len(found) > 20
