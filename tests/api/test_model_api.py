"""The model API of CANN 8.0.RC2-8.2 (spec §9) between a prompt and a decoder on two daemons.

``add_model(ModelConfig().generate_options(), runner)`` -> ``LLMModel``; the prompt's ``predict`` runs
the user's ``ModelRunner.run_model`` on a fresh KV cache keyed by the requests; the decoder pulls a
request's KV (``pull_kv``), merges it into a batch slot (``merge_kv``) or pulls it into blocks
(``pull_blocks``), and its ``predict`` runs on the batch cache. Prefixes live under ``prefix_id``.
"""

from __future__ import annotations

import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration

P, D = 31, 32
OPS = "tests.api._ops"
TENSORS = 4
SHAPES = ["2,16"] * TENSORS  # batch 2, 16 bytes per slot per tensor (uint8)
EXC = "LLMException"


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


def req(req_id: int = 2**64 - 1, prefix_id: int = 2**64 - 1) -> dict:
    return {"req": {"req_id": req_id, "prompt_cluster_id": P, "decoder_cluster_id": D, "prefix_id": prefix_id}}


def slots(arrays: list, batch: int) -> list:
    return [int(a.reshape(a.shape[0], -1)[batch][0]) for a in arrays]


def test_predict_pull_merge_prefix_capacity(daemon_factory, worker_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    run(prompt, "init_v1", "PROMPT", P, listen=f"127.0.0.1:{port}")
    run(decoder, "init_v1", "DECODER", D)
    assert run(prompt, "model_add", "m", SHAPES) == 0
    assert run(decoder, "model_add", "m", SHAPES) == 0
    assert run(decoder, "model_call", "m", "allocated") == [1]  # on_cache_allocated: the decoder's batch cache
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    model = lambda w, *a, **k: run(w, "model_call", "m", *a, **k)  # noqa: E731

    # prompt: one predict for two requests; trailing idle requests may be omitted
    assert model(prompt, "predict", [req(10), req(11)], [], write={0: 10, 1: 11}) == []
    assert model(decoder, "pull_kv", req(11)) is None
    assert model(decoder, "merge_kv", req(11), 0) is None
    assert model(decoder, "pull_kv", req(10)) is None
    assert model(decoder, "merge_kv", req(10), 1) is None
    out = model(decoder, "predict", [req(11), req(10)], [], read=True)  # DECODER: exactly the batch size
    assert slots(out, 0) == [11 + t for t in range(TENSORS)] and slots(out, 1) == [10 + t for t in range(TENSORS)]
    assert model(decoder, "predict", [req(11)], []) == (EXC, "LLM_PARAM_INVALID")
    assert model(decoder, "pull_kv", req(10)) == (EXC, "LLM_KV_CACHE_NOT_EXIST")  # consumed by the first pull
    assert model(decoder, "merge_kv", req(10), 0) == (EXC, "LLM_KV_CACHE_NOT_EXIST")  # nothing staged
    assert model(decoder, "merge_kv", req(10), 2) == (EXC, "LLM_PARAM_INVALID")       # batch index out of range

    # pulling twice without merging; complete_request drops the staged KV
    model(prompt, "predict", [req(12)], [], write={0: 12})
    assert model(decoder, "pull_kv", req(12)) is None
    assert model(decoder, "pull_kv", req(12)) == (EXC, "LLM_REPEAT_REQUEST")
    assert run(decoder, "dd_call", "complete_request", req(12)) is None
    assert model(decoder, "merge_kv", req(12), 0) == (EXC, "LLM_KV_CACHE_NOT_EXIST")

    # prefixes: preload once, used by predict, released once
    assert model(prompt, "preload_prompt_prefix", req(prefix_id=5), [], write={0: 50}) is None
    assert model(prompt, "preload_prompt_prefix", req(prefix_id=5), []) == (EXC, "LLM_PREFIX_ALREADY_EXIST")
    out = model(prompt, "predict", [req(13, prefix_id=5)], [], read=True)
    assert slots(out, 0) == [50 + t for t in range(TENSORS)]  # the prefix KV was in the request's slot
    assert model(prompt, "release_prompt_prefix", req(prefix_id=5)) is None
    assert model(prompt, "release_prompt_prefix", req(prefix_id=5)) == (EXC, "LLM_PREFIX_NOT_EXIST")
    assert model(prompt, "predict", [req(14, prefix_id=5)], []) == (EXC, "LLM_PREFIX_NOT_EXIST")

    # complete_request on the prompt frees KV nobody will pull
    assert run(prompt, "dd_call", "complete_request", req(13)) is None
    assert model(decoder, "pull_kv", req(13)) == (EXC, "LLM_KV_CACHE_NOT_EXIST")

    # PagedAttention: the request's contiguous KV into block (row) 1 of the decoder's batch cache
    model(prompt, "predict", [req(15)], [], write={0: 77})
    assert model(decoder, "pull_blocks", req(15), [], [1]) is None
    out = model(decoder, "predict", [req(), req()], [], read=True)
    assert slots(out, 1) == [77 + t for t in range(TENSORS)] and slots(out, 0) == [11 + t for t in range(TENSORS)]
    assert model(decoder, "pull_blocks", req(15), [0, 1], [1]) == (EXC, "LLM_PARAM_INVALID")

    # capacity (PROMPT only): 4 tensors x 16 bytes per slot of 16 tokens -> 4 bytes per token
    available, free, total = run(prompt, "dd_call", "check_capacity", 1)
    pool = int((8 << 20) * 0.95)
    assert available and total == pool // 4 and 0 < free <= total
    assert run(prompt, "dd_call", "check_capacity", free + 1)[0] is False
    assert run(decoder, "dd_call", "check_capacity", 1) == (EXC, "LLM_PARAM_INVALID")
