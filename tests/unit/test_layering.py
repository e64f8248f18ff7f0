"""Rooms of the design: only datadistd.rpc imports grpc; importing datadistd loads no device library."""

from __future__ import annotations

import subprocess
import sys

GRPC_FREE = ["datadistd", "datadistd.core.types", "datadistd.core.registry", "datadistd.core.layout",
             "datadistd.core.allocator", "datadistd.core.plan", "datadistd.core.options", "datadistd.engine",
             "datadistd.links", "datadistd.node", "datadistd.comm", "datadistd.memory", "datadistd.memory.host",
             "datadistd.transport", "datadistd.transport.tcp", "datadistd.config"]


def loaded_after(imports: list[str]) -> set[str]:
    code = f"import sys; import {', '.join(imports)}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_domain_imports_no_grpc_and_no_device_library() -> None:
    mods = loaded_after(GRPC_FREE)
    assert not {m for m in mods if m == "grpc" or m.startswith("grpc.")}
    assert not {m for m in mods if m.split(".")[0] in ("acl", "torch", "torch_npu", "hccl", "cupy", "pycuda")}
    assert "datadistd.rpc" not in mods


def test_unknown_backend_and_transport_list_the_known_ones() -> None:
    import pytest

    from datadistd.memory import get_backend
    from datadistd.transport import get_transport

    with pytest.raises(ValueError, match="known: acl, cuda, host"):
        get_backend("nvme")
    with pytest.raises(ValueError, match="known: hccl, local, tcp"):
        get_transport("rdma")


def test_device_backends_fail_clearly_without_hardware() -> None:
    import pytest

    from datadist.status import LLMStatusCode
    from datadistd.core.errors import DataDistError
    from datadistd.memory import get_backend

    for name in ("acl", "cuda"):
        with pytest.raises(DataDistError) as info:
            get_backend(name)
        assert info.value.code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
        assert "host" in info.value.message
