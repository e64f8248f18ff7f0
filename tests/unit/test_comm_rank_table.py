"""Where a comm domain finds a rank's daemon in CANN's rank table (``links.comm.parse_rank_table``): on its server,
``server_id`` -- the host, as CANN's and vllm-ascend's tables write it -- not ``device_ip``, the NPU's NIC address no
daemon listens on; ``device_ip`` only where ``server_id`` is a name."""

from __future__ import annotations

import json

import pytest

from datadistd.core.errors import DataDistError
from datadistd.links.comm import parse_rank_table


def _table(*servers: tuple[str, str, int | None]) -> str:
    server_list = []
    for rank, (server_id, device_ip, port) in enumerate(servers):
        device = {"device_id": "0", "device_ip": device_ip, "rank_id": str(rank)}
        if port is not None:
            device["device_port"] = str(port)
        server_list.append({"server_id": server_id, "device": [device]})
    return json.dumps({"version": "1.2", "server_count": str(len(servers)), "status": "completed",
                       "server_list": server_list})


def test_a_rank_is_reached_on_its_server_not_at_its_npus_nic():
    # vllm-ascend's table (docs/spec.md): server_id the host's address, device_ip the NPU's NIC address
    text = _table(("10.1.0.5", "192.168.100.11", None), ("10.1.0.6", "192.168.100.12", 26001))
    assert parse_rank_table(text, [0, 1], 26000) == {0: ("10.1.0.5", 26000), 1: ("10.1.0.6", 26001)}


def test_a_named_server_is_reached_at_its_device_ip():
    text = _table(("node-a", "127.0.0.1", 26010), ("node-b", "::1", 26011))
    assert parse_rank_table(text, [0, 1], 26000) == {0: ("127.0.0.1", 26010), 1: ("::1", 26011)}


def test_a_bad_address_is_still_refused():
    with pytest.raises(DataDistError, match="invalid"):
        parse_rank_table(_table(("node-a", "not-an-ip", None)), [0], 26000)
