"""Private: ``transfer_cache_async`` -- validation (CANN's rules and order) and the worker-side thread.

The thread asks the user's ``LayerSynchronizer`` for each source layer that some config holds
(``synchronize_layer(l, None)``) and, as soon as it says True, tells the daemon over the task's
one bidirectional stream that layer ``l`` is ready. The daemon sends the layer to every config
holding it while the worker computes ``l + 1`` and streams back one event per (config, layer);
a reader thread turns the final ones into the ``CacheTask`` results. False aborts (the configs
holding the layer get ``LLM_PARAM_INVALID``); as in CANN the task stops at its first failure and
configs that never completed keep ``None``.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, List, Optional, Sequence

import grpc

from datadist.v1 import datadist_pb2

from . import _validate as v
from ._convert import any_key_pb, range_pb
from ._engine import EngineView
from ._rpc import rpc_exception
from ._task import CacheTask
from .llm_types import TENSORS_PER_LAYER, LayerSynchronizer, TransferConfig, TransferWithCacheKeyConfig
from .status import LLMStatusCode

__all__ = ["check_transfer_args", "start_transfer"]

log = logging.getLogger(__name__)

_END = object()


def _check_block_indices(name: str, value: Any) -> None:
    if value is not None:
        v.check_isinstance(name, value, [list, tuple], inner_class=int, allow_none=False)
        v.check_list_uint64(name, value)


def check_transfer_args(num_tensors: int, batch_size: int, layer_synchronizer: Any, transfer_configs: Any,
                        src_block_indices: Any, dst_block_indices: Any, dst_block_memory_size: Any,
                        remote_cache_accessible: bool, v1: bool) -> List[range]:
    """CANN's ``transfer_cache_async`` checks, in CANN's order; returns each config's source layer range."""
    _check_block_indices("dst_block_indices", dst_block_indices)
    _check_block_indices("src_block_indices", src_block_indices)
    if dst_block_memory_size is not None:
        v.check_uint64("dst_block_memory_size", dst_block_memory_size)
    if src_block_indices:  # the source is blocks
        v.raise_if_false(dst_block_indices, "transfer from blocks to cache is not supported")
        v.raise_if_false(len(src_block_indices) == len(dst_block_indices),
                         "num_block_indices mismatches, src_num = {0}, dst_num = {1}",
                         len(src_block_indices), len(dst_block_indices))
    else:
        v.raise_if_true(v1 and dst_block_indices is not None, "transfer from cache to blocks is not supported")
        if dst_block_indices:
            v.raise_if_false(dst_block_memory_size is not None,
                             "dst_block_memory_size must be set when transfer from cache to blocks")
    v.check_isinstance("layer_synchronizer", layer_synchronizer, [LayerSynchronizer], allow_none=False)
    if remote_cache_accessible:
        v.check_isinstance("transfer_configs", transfer_configs, [list, tuple], inner_class=TransferWithCacheKeyConfig,
                           extra_fmt="While enable_remote_cache_accessible is True, ", allow_none=False)
    else:
        v.check_isinstance("transfer_configs", transfer_configs, [list, tuple], inner_class=TransferConfig,
                           allow_none=False)
    v.raise_if_false(dst_block_indices or dst_block_memory_size in (None, 0),
                     "dst_block_memory_size ({0}) is neither None nor 0 while dst is not blocks", dst_block_memory_size)
    v.raise_if_false(num_tensors % TENSORS_PER_LAYER == 0, "cache_desc.num_tensors ({0}) is not even", num_tensors)
    num_layers = num_tensors // TENSORS_PER_LAYER
    ranges = []
    for config in transfer_configs:
        layers = config.src_layer_range if config.src_layer_range is not None else range(0, num_layers)
        if src_block_indices:
            v.raise_if_false(config.src_batch_index == 0,
                             "Invalid TransferConfig, src_batch_index ({0}) != 0 while src is blocks",
                             config.src_batch_index)
            v.raise_if_false(0 <= config.src_batch_index < batch_size,
                             "Invalid TransferConfig, src_batch_index ({0}) out of range: [0, {1})",
                             config.src_batch_index, batch_size)
        v.raise_if_false(0 <= layers.start < layers.stop <= num_layers,
                         "src_layer_range: {0} out of range, src_layer_num = {1}", layers, num_layers)
        expected = len(layers) * TENSORS_PER_LAYER
        if isinstance(config, TransferConfig):
            v.raise_if_false(len(config.dst_addrs) == expected, "expect {0} dst_addrs, but len(dst_addrs) = {1}, "
                                                                "range = {2}", expected, len(config.dst_addrs), layers)
        ranges.append(layers)
    return ranges


def _target_pb(config: Any, layers: range) -> datadist_pb2.LayerTransferTarget:
    msg = datadist_pb2.LayerTransferTarget(dst_cluster_id=config.dst_cluster_id, src_layer_range=range_pb(layers),
                                           src_batch_index=config.src_batch_index)
    if isinstance(config, TransferWithCacheKeyConfig):
        msg.cache_key.CopyFrom(any_key_pb(config.cache_key))
        msg.dst_layer_range.CopyFrom(range_pb(config.dst_layer_range))
    else:
        msg.dst_addrs.extend(config.dst_addrs)
    return msg


class _Run:
    """One task: the synchronizer thread (requests) and the reader thread (events -> results)."""

    def __init__(self, responses: Any, requests: "queue.Queue[Any]", task: CacheTask, synchronizer: Any,
                 ranges: Sequence[range], num_layers: int) -> None:
        self._responses = responses
        self._requests = requests
        self._task = task
        self._sync = synchronizer
        self._ranges = list(ranges)
        self._num_layers = num_layers
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="datadist-layerwise-events", daemon=True)
        self._writer = threading.Thread(target=self._write, name="datadist-layerwise", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def _write(self) -> None:
        try:
            for layer in range(self._num_layers):
                if self._stop.is_set():
                    break
                if not any(layer in r for r in self._ranges):
                    continue  # CANN does not synchronize a layer that no config sends
                try:
                    ok = self._sync.synchronize_layer(layer, None)
                except Exception:  # noqa: BLE001 - a user hook; its failure aborts like False
                    log.exception("synchronize_layer(%d) raised; aborting the transfer", layer)
                    ok = False
                if self._stop.is_set():
                    break
                if not ok:
                    log.error("synchronize_layer(%d) returned False; aborting the transfer", layer)
                    self._requests.put(datadist_pb2.LayerTransferRequest(abort_layer=layer))
                    break
                self._requests.put(datadist_pb2.LayerTransferRequest(ready_layer=layer))
        finally:
            self._requests.put(_END)  # half-close: the daemon finishes what it has, then ends the stream
            self._reader.join()
            self._task._finish()

    def _read(self) -> None:
        try:
            for event in self._responses:
                if not event.final:
                    continue
                code = LLMStatusCode(event.status) if event.status in LLMStatusCode._value2member_map_ \
                    else LLMStatusCode.LLM_FAILED
                self._task._set_result(event.target, code)
                if code != LLMStatusCode.LLM_SUCCESS:
                    log.error("transfer_cache_async: config %d failed at layer %d: %s", event.target, event.layer,
                              event.message)
                    self._stop.set()
        except grpc.RpcError as err:
            exc = rpc_exception(err, "transfer_cache_async")
            if err.code() != grpc.StatusCode.CANCELLED:
                log.error("%s", exc)
            self._stop.set()
        finally:
            self._stop.set()
            self._requests.put(_END)  # unblock gRPC's request thread if the daemon ended the stream first


def start_transfer(owner: EngineView, src_cache_id: int, src_desc: Any, layer_synchronizer: Any,
                   transfer_configs: List[Any], src_block_indices: Optional[Sequence[int]],
                   dst_block_indices: Optional[Sequence[int]], dst_block_memory_size: Optional[int],
                   default_error: LLMStatusCode, ranges: Optional[Sequence[range]] = None) -> CacheTask:
    """Open the task's stream, wait until the daemon accepted it (errors raise here), start the threads."""
    task = CacheTask(len(transfer_configs), default_error)
    num_layers = src_desc.num_tensors // TENSORS_PER_LAYER
    if ranges is None:
        ranges = [c.src_layer_range if c.src_layer_range is not None else range(0, num_layers)
                  for c in transfer_configs]
    if not transfer_configs:
        task._finish()
        return task
    start = datadist_pb2.LayerTransferStart(
        engine_id=owner._engine_id, src_cache_id=src_cache_id,
        targets=[_target_pb(c, r) for c, r in zip(transfer_configs, ranges, strict=True)],
        src_block_indices=list(src_block_indices or ()), dst_block_indices=list(dst_block_indices or ()),
        dst_block_memory_size=dst_block_memory_size or 0)
    requests: "queue.Queue[Any]" = queue.Queue()
    requests.put(datadist_pb2.LayerTransferRequest(start=start))

    def request_iter():  # noqa: ANN202 - consumed by gRPC's own thread
        while True:
            item = requests.get()
            if item is _END:
                return
            yield item

    responses = owner._check_init().stream("TransferCacheAsync", request_iter())
    try:
        first = next(responses)
    except grpc.RpcError as err:
        requests.put(_END)
        raise rpc_exception(err, "transfer_cache_async") from None
    except StopIteration:
        requests.put(_END)
        raise rpc_exception_closed() from None
    if not first.accepted:  # pragma: no cover - protocol guard
        requests.put(_END)
        responses.cancel()
        raise rpc_exception_closed()
    _Run(responses, requests, task, layer_synchronizer, ranges, num_layers).start()
    return task


def rpc_exception_closed() -> Exception:
    from .status import LLMException

    return LLMException("[transfer_cache_async] failed, error code is LLMStatusCode.LLM_FAILED, the daemon closed "
                        "the stream before accepting the task.", status_code=LLMStatusCode.LLM_FAILED)
