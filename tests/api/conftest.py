from __future__ import annotations

import pytest

import llm_datadist as ld
from tests.harness import free_port


@pytest.fixture
def local_dd():
    """An ``LLMDataDist`` in this process (embedded daemon): ``local_dd(role, v1=False, **options)``."""
    made: list = []

    def make(role: str = "PROMPT", cluster_id: int = 7, v1: bool = False, rca: bool | None = None,
             listen: bool | None = None, mem_pool: int = 4 << 20, switch: bool = False,
             extra: dict | None = None) -> ld.LLMDataDist:
        cfg = ld.LLMConfig()
        cfg.device_id = 0
        cfg.sync_kv_timeout = 2000
        if switch:
            cfg.enable_switch_role = True
        if v1:
            cfg.ge_options = {"ge.flowGraphMemMaxSize": str(mem_pool)}
        else:
            cfg.enable_cache_manager = True
            cfg.mem_pool_cfg = f'{{"memory_size": {mem_pool}}}'
            cfg.host_mem_pool_cfg = f'{{"memory_size": {mem_pool}}}'
            if rca is not None:
                cfg.enable_remote_cache_accessible = rca
        if listen if listen is not None else (v1 and role == "PROMPT"):
            cfg.listen_ip_info = f"127.0.0.1:{free_port()}"
        options = cfg.generate_options()
        options.update(extra or {})
        dd = ld.LLMDataDist(getattr(ld.LLMRole, role), cluster_id)
        made.append(dd)
        dd.init(options)
        return dd

    yield make
    for dd in made:
        dd.finalize()
