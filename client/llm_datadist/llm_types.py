"""Descriptors, keys, cache handles and layer-wise transfer configs (CANN ``llm_datadist.v2.llm_types``).

Pure data with CANN's validation: TypeError for wrong types, ValueError for integers out of
range, ``LLMException(LLM_PARAM_INVALID)`` for semantic rules. ``CacheTask`` lives in ``_task``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from enum import Enum, IntEnum
from typing import Any, List, Optional, Tuple, Union, cast

from . import _validate as v
from .data_type import DataType, _itemsize
from .status import LLMException, LLMStatusCode

__all__ = [
    "Placement", "RegisterMemStatus", "Memtype", "PushType", "MemInfo", "CacheDesc", "CacheKey",
    "CacheKeyByIdAndIndex", "BlocksCacheKey", "Cache", "KvCache", "LayerSynchronizer", "TransferConfig",
    "TransferWithCacheKeyConfig", "layer_range_to_tensor_indices",
]

_INVALID_ID = 2**64 - 1


class Placement(IntEnum):
    """Where a cache's memory is: ``HOST`` (0) or ``DEVICE`` (1); ``str()`` gives ``"Placement.DEVICE"``."""

    HOST = 0
    DEVICE = 1

    def __str__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"


class RegisterMemStatus(Enum):
    """What ``LLMDataDist.query_register_mem_status`` answers for a link: ``OK`` (0), ``PREPARING`` (1) or
    ``FAILED`` (2); an unknown engine value is ``FAILED``."""

    OK = 0
    PREPARING = 1
    FAILED = 2

    @classmethod
    def _missing_(cls, value: object) -> Optional["RegisterMemStatus"]:
        # CANN maps any unknown engine value to FAILED
        return cls.FAILED if isinstance(value, int) else None

    @classmethod
    def from_int(cls, value: int) -> "RegisterMemStatus":
        """The member of an engine value.

        Args:
            value: the engine's number.

        Returns:
            The member; ``FAILED`` for an unknown value.

        Raises:
            Nothing.
        """
        return cls(value)


class Memtype(Enum):
    """The kind of memory a ``MemInfo`` names: ``MEM_TYPE_DEVICE`` (0) or ``MEM_TYPE_HOST`` (1)."""

    MEM_TYPE_DEVICE = 0
    MEM_TYPE_HOST = 1


class PushType(Enum):
    """Internal: what addresses the destination of one layer-wise transfer."""

    NO_CACHE_KEY = 0
    BLOCKS_CACHE_KEY = 1
    CACHE_KEY_BY_ID = 2


class MemInfo:
    """A registered memory region, for ``CacheManager.remap_registered_memory``."""

    def __init__(self, mem_type: Memtype, addr: int, size: int) -> None:
        """A range of memory (``remap_registered_memory``).

        Args:
            mem_type: ``Memtype.MEM_TYPE_DEVICE`` or ``MEM_TYPE_HOST``.
            addr: its address (uint64).
            size: its bytes (uint64).

        Raises:
            TypeError, ValueError: arguments of the wrong type or range.
        """
        v.check_isinstance("mem_type", mem_type, [Memtype], allow_none=False)
        v.check_isinstance("addr", addr, [int], allow_none=False)
        v.check_isinstance("size", size, [int], allow_none=False)
        self._mem_type = mem_type
        self._addr = addr
        self._size = size

    @property
    def mem_type(self) -> Memtype:
        """The ``Memtype`` of the memory."""
        return self._mem_type

    @property
    def addr(self) -> int:
        """The memory's address."""
        return self._addr

    @property
    def size(self) -> int:
        """The memory's size in bytes."""
        return self._size

    def __repr__(self) -> str:
        return f"MemInfo(mem_type={self._mem_type}, addr={self._addr}, size={self._size})"


# ---- descriptors -------------------------------------------------------------------------------


class CacheDesc:
    """``num_tensors`` equally shaped tensors of ``data_type``.

    ``shape[0]`` is the batch size (contiguous caches) or the number of blocks (blocks caches).
    ``size`` is the byte size of ONE tensor. A tuple ``shape`` is stored as a list so that
    ``update_dim`` works; a list is kept as the same object. ``batch_size`` follows ``update_dim``.
    """

    def __init__(self, num_tensors: int, shape: Union[Tuple[int, ...], List[int]], data_type: DataType,
                 placement: Placement = Placement.DEVICE, batch_dim_index: int = 0, seq_len_dim_index: int = -1,
                 kv_tensor_format: Optional[str] = None) -> None:
        """Describe a cache.

        Args:
            num_tensors: tensors in the cache (uint32; allocate and register need > 0).
            shape: dimensions of each tensor (int64 each); ``shape[0]`` is the batch size or the number of blocks.
            data_type: the element ``DataType``.
            placement: ``Placement.DEVICE`` (NPU memory with the ``acl`` backend) or ``HOST``.
            batch_dim_index: the batch dimension, in ``[0, len(shape))``.
            seq_len_dim_index: the sequence dimension, -1 or in ``[0, len(shape))``.
            kv_tensor_format: the tensors' format name, or None.

        Raises:
            TypeError, ValueError: arguments of the wrong type or range.
            LLMException: ``LLM_PARAM_INVALID`` (a dimension index out of range).
        """
        v.check_uint32("num_tensors", num_tensors)
        v.check_isinstance("shape", shape, [tuple, list], inner_class=int, allow_none=False)
        v.check_isinstance("data_type", data_type, [DataType], allow_none=False)
        v.check_isinstance("placement", placement, [Placement], allow_none=False)
        v.check_isinstance("batch_dim_index", batch_dim_index, [int], allow_none=False)
        v.check_int32("seq_len_dim_index", seq_len_dim_index)
        v.check_isinstance("kv_tensor_format", kv_tensor_format, [str])
        v.raise_if_false(0 <= batch_dim_index < len(shape),
                         "batch_dim_index {0} out of range, [0, {1})", batch_dim_index, len(shape))
        v.raise_if_false(seq_len_dim_index == -1 or 0 <= seq_len_dim_index < len(shape),
                         "seq_len_dim_index {0} is invalid, should be -1 or in range [0, {1})",
                         seq_len_dim_index, len(shape))
        v.check_list_int64("shape", shape)
        self._num_tensors = num_tensors
        self._shape: List[int] = shape if isinstance(shape, list) else list(shape)
        self._data_type = data_type
        self._placement = placement
        self._batch_dim = batch_dim_index
        self._seq_len_dim_index = seq_len_dim_index
        self._kv_tensor_format = kv_tensor_format
        self._is_blocks = False

    @property
    def num_tensors(self) -> int:
        """Tensors in the cache."""
        return self._num_tensors

    @property
    def shape(self) -> List[int]:
        """Dimensions of each tensor (the list ``update_dim`` changes in place)."""
        return self._shape

    def update_dim(self, dim_index: int, dim_value: int) -> None:
        """Set ``shape[dim_index] = dim_value`` in place.

        Args:
            dim_index: the dimension.
            dim_value: its new size (int64).

        Raises:
            TypeError, ValueError: ``dim_value`` not an int64.
            IndexError: ``dim_index`` out of range.
        """
        v.check_int64("dim_value", dim_value)
        self._shape[dim_index] = dim_value

    @property
    def data_type(self) -> DataType:
        """The element ``DataType``."""
        return self._data_type

    @property
    def placement(self) -> Placement:
        """``Placement.DEVICE`` or ``HOST``."""
        return self._placement

    @property
    def batch_dim(self) -> int:
        """The batch dimension's index."""
        return self._batch_dim

    @property
    def batch_size(self) -> int:
        """``shape[batch_dim]``: the batch size, or the number of blocks of a blocks cache."""
        return self._shape[self._batch_dim]

    @property
    def seq_len_dim_index(self) -> int:
        """The sequence dimension's index, or -1."""
        return self._seq_len_dim_index

    @property
    def kv_tensor_format(self) -> Optional[str]:
        """The tensors' format name, or None."""
        return self._kv_tensor_format

    @property
    def size(self) -> int:
        """Bytes of one tensor: ``prod(shape) * itemsize``; a negative (dynamic) dim or DT_STRING -> LLMException."""
        if any(d < 0 for d in self._shape):
            raise LLMException(f"Failed to calc tensor size, shape = {self._shape}, data_type = {self._data_type}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        return math.prod(self._shape) * _itemsize(self._data_type)

    def __repr__(self) -> str:
        return (f"CacheDesc(num_tensors={self._num_tensors}, shape={self._shape}, data_type={self._data_type}, "
                f"placement={self._placement}, batch_dim_index={self._batch_dim}, "
                f"seq_len_dim_index={self._seq_len_dim_index}, kv_tensor_format={self._kv_tensor_format})")


# ---- keys ----------------------------------------------------------------------------------------


def _collect_params(limit: int, names: Tuple[str, ...], args: Tuple[Any, ...], kwargs: dict) -> dict:
    """Merge positional ``args`` into ``kwargs`` under ``names`` (CANN's key constructors)."""
    v.raise_if_false(len(args) + len(kwargs) <= limit, "Param num is over limit")
    params = dict(kwargs)
    for name, value in zip(names, args, strict=False):
        v.raise_if_true(name in params, "Param {} is given twice", name)
        params[name] = value
    return params


class CacheKey:
    """Key of one batch slot of a contiguous cache.

    ``CacheKey(cluster_id, req_id, model_id=0, prefix_id=2**64-1)``, or keywords ``prompt_cluster_id``
    or ``cluster_id``, ``req_id``, ``model_id``, ``prefix_id``. All uint64. ``cluster_id`` only routes
    pulls; the owner indexes keys by ``(req_id | prefix_id, model_id)``. Compared by value.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """A key: ``CacheKey(cluster_id, req_id, model_id=0, prefix_id=2**64-1)``, or keywords.

        Args:
            *args: ``cluster_id``, ``req_id``, ``model_id``, ``prefix_id`` in that order (at most 4 in all).
            **kwargs: the same by name; ``prompt_cluster_id`` is another name of ``cluster_id``.

        Raises:
            TypeError, ValueError: a value not a uint64.
            LLMException: ``LLM_PARAM_INVALID`` (no cluster id or ``req_id``, an unknown name, more than 4).
        """
        params = _collect_params(4, ("cluster_id", "req_id", "model_id", "prefix_id"), args, kwargs)
        v.raise_if_false("prompt_cluster_id" in params or "cluster_id" in params,
                         "Param prompt_cluster_id or cluster_id is required")
        v.raise_if_false("req_id" in params, "Param req_id is required")
        for k in params:
            v.raise_if_false(k in ("prompt_cluster_id", "cluster_id", "req_id", "model_id", "prefix_id"),
                             "Unsupported param:{}", k)
        self._cluster_id = params["cluster_id"] if "cluster_id" in params else params["prompt_cluster_id"]
        self._req_id = params["req_id"]
        self._model_id = params.get("model_id", 0)
        self._prefix_id = params.get("prefix_id", _INVALID_ID)
        v.check_uint64("cluster_id", self._cluster_id)
        v.check_uint64("req_id", self._req_id)
        v.check_uint64("model_id", self._model_id)
        v.check_uint64("prefix_id", self._prefix_id)

    @property
    def prompt_cluster_id(self) -> int:
        """The cluster that holds the key (the same as ``cluster_id``)."""
        return self._cluster_id

    @property
    def cluster_id(self) -> int:
        """The cluster that holds the key (routes a pull; ignored when binding)."""
        return self._cluster_id

    @property
    def req_id(self) -> int:
        """The request id (uint64; ``2**64 - 1``: none)."""
        return self._req_id

    @property
    def model_id(self) -> int:
        """The model id (uint64, default 0)."""
        return self._model_id

    @property
    def prefix_id(self) -> int:
        """The prefix id (uint64; ``2**64 - 1``, the default: none)."""
        return self._prefix_id

    def _key(self) -> Tuple[int, int, int, int]:
        return self._cluster_id, self._req_id, self._model_id, self._prefix_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheKey) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((CacheKey, self._key()))

    def __repr__(self) -> str:
        return (f"CacheKey(cluster_id={self._cluster_id}, req_id={self._req_id}, prefix_id={self._prefix_id}, "
                f"model_id={self._model_id})")


class CacheKeyByIdAndIndex:
    """Batch slot ``batch_index`` of the remote cache ``cache_id`` on ``cluster_id`` (uint64 / int64 / uint32)."""

    def __init__(self, cluster_id: int, cache_id: int, batch_index: int = 0) -> None:
        """A remote cache slot by id.

        Args:
            cluster_id: the cluster that holds the cache (uint64).
            cache_id: the cache's id there (int64).
            batch_index: the slot (uint32).

        Raises:
            TypeError, ValueError: arguments of the wrong type or range.
        """
        v.check_uint64("cluster_id", cluster_id)
        v.check_int64("cache_id", cache_id)
        v.check_uint32("batch_index", batch_index)
        self._cluster_id = cluster_id
        self._cache_id = cache_id
        self._batch_index = batch_index

    @property
    def cluster_id(self) -> int:
        """The cluster that holds the cache."""
        return self._cluster_id

    @property
    def cache_id(self) -> int:
        """The cache's id on that cluster."""
        return self._cache_id

    @property
    def batch_index(self) -> int:
        """The batch slot."""
        return self._batch_index

    def _key(self) -> Tuple[int, int, int]:
        return self._cluster_id, self._cache_id, self._batch_index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheKeyByIdAndIndex) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((CacheKeyByIdAndIndex, self._key()))

    def __repr__(self) -> str:
        return (f"CacheKeyByIdAndIndex(cluster_id={self._cluster_id}, cache_id={self._cache_id}, "
                f"batch_index={self._batch_index})")


class BlocksCacheKey:
    """Key of a blocks (paged) cache: ``BlocksCacheKey(cluster_id, model_id=0)`` or keywords.

    Types are checked as in CANN (TypeError "The first param cluster_id only support ['int'], ...");
    negative values are a ValueError here (CANN only fails later, in its C++ binding).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """A blocks cache's key: ``BlocksCacheKey(cluster_id, model_id=0)``, or keywords.

        Args:
            *args: ``cluster_id``, ``model_id`` in that order (at most 2 in all).
            **kwargs: the same by name; ``prompt_cluster_id`` is another name of ``cluster_id``.

        Raises:
            TypeError: a value not an int. ValueError: a value not a uint64.
            LLMException: ``LLM_PARAM_INVALID`` (no cluster id, an unknown name, more than 2).
        """
        params = _collect_params(2, ("cluster_id", "model_id"), args, kwargs)
        v.raise_if_false("prompt_cluster_id" in params or "cluster_id" in params,
                         "Param prompt_cluster_id or cluster_id is required")
        for k in params:
            v.raise_if_false(k in ("prompt_cluster_id", "cluster_id", "model_id"), "Unsupported param:{}", k)
        self._cluster_id_key = "cluster_id" if "cluster_id" in params else "prompt_cluster_id"
        self._cluster_id = params[self._cluster_id_key]
        self._model_id = params.get("model_id", 0)
        v.check_isinstance("cluster_id", self._cluster_id, [int], extra_fmt="The first param ", allow_none=False)
        v.check_isinstance("model_id", self._model_id, [int], extra_fmt="The second param ", allow_none=False)
        v.check_uint64("cluster_id", self._cluster_id)
        v.check_uint64("model_id", self._model_id)

    @property
    def prompt_cluster_id(self) -> int:
        """The cluster that holds the cache (the same as ``cluster_id``)."""
        return self._cluster_id

    @property
    def cluster_id(self) -> int:
        """The cluster that holds the cache (its own when registering, the peer's when pulling)."""
        return self._cluster_id

    @property
    def model_id(self) -> int:
        """The model id: one pullable blocks cache per model id per node."""
        return self._model_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlocksCacheKey) and (self._cluster_id, self._model_id) == (
            other._cluster_id, other._model_id)

    def __hash__(self) -> int:
        return hash((BlocksCacheKey, self._cluster_id, self._model_id))

    def __repr__(self) -> str:
        return f"BlocksCacheKey({self._cluster_id_key}={self._cluster_id}, model_id={self._model_id})"


# ---- caches --------------------------------------------------------------------------------------


def _check_cpu_desc(cache_desc: CacheDesc) -> None:
    v.check_isinstance("cache_desc", cache_desc, [CacheDesc], allow_none=False)
    v.raise_if_false(cache_desc.placement == Placement.HOST, "cache_desc placement must be HOST")


class Cache:
    """A cache (v2), made by ``CacheManager``; not user-constructed except via ``create_cpu_cache``.

    ``tensor_addrs`` holds one address per tensor in this process; it becomes ``[]`` after
    deallocation. No automatic free on garbage collection (as CANN).
    """

    def __init__(self, cache_id: int, cache_desc: CacheDesc, tensor_addrs: List[int], cache_manager: Any = None,
                 is_registered: bool = False, is_blocks_cache: bool = False) -> None:
        """Made by ``CacheManager`` (or ``create_cpu_cache``), not by users.

        Args:
            cache_id: the engine's id of the cache (-1: a host cache of ``create_cpu_cache``).
            cache_desc: its description.
            tensor_addrs: one address per tensor in this process.
            cache_manager: the manager that made it.
            is_registered: the memory is the worker's own (``register_cache``).
            is_blocks_cache: a blocks (paged) cache.

        Raises:
            TypeError, ValueError: ``cache_id`` not an int64.
        """
        v.check_int64("cache_id", cache_id)
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._tensor_addrs = tensor_addrs
        self._cache_manager = cache_manager
        self._is_registered = is_registered
        self._is_blocks_cache = is_blocks_cache
        self._valid = True

    @property
    def cache_id(self) -> int:
        """The engine's id of the cache (-1 for a host cache of ``create_cpu_cache``)."""
        return self._cache_id

    @property
    def cache_desc(self) -> CacheDesc:
        """The cache's ``CacheDesc``."""
        return self._cache_desc

    @property
    def tensor_addrs(self) -> List[int]:
        """One address per tensor in this process; ``[]`` after deallocation."""
        return self._tensor_addrs

    @tensor_addrs.setter
    def tensor_addrs(self, tensor_addrs: List[int]) -> None:
        """Internal: the cache manager clears it on deallocation."""
        self._tensor_addrs = tensor_addrs

    @property
    def is_blocks_cache(self) -> bool:
        """Whether it is a blocks (paged) cache."""
        return self._is_blocks_cache

    @classmethod
    def create_cpu_cache(cls, cache_desc: CacheDesc, addrs: List[int]) -> "Cache":
        """A host blocks cache over user memory, for ``swap_blocks``.

        Args:
            cache_desc: HOST placement.
            addrs: one address per tensor (uint64).

        Returns:
            The ``Cache`` (``cache_id`` -1).

        Raises:
            TypeError, ValueError: ``addrs`` not a list of uint64.
            LLMException: ``LLM_PARAM_INVALID`` (not HOST placement, ``len(addrs) != num_tensors``).
        """
        _check_cpu_desc(cache_desc)
        v.check_isinstance("addrs", addrs, [list, tuple], inner_class=int, allow_none=False)
        v.check_list_uint64("addrs", addrs)
        v.raise_if_false(cache_desc.num_tensors == len(addrs),
                         f"cache_desc num_tensors:{cache_desc.num_tensors} not equal addrs num:{len(addrs)}")
        return cls(-1, cache_desc, list(addrs), None, False, True)

    def __repr__(self) -> str:
        return (f"Cache(cache_id = {self._cache_id}, device_tensor_addrs = {len(self._tensor_addrs)}, "
                f"is_blocks_cache = {self._is_blocks_cache})")


class KvCache:
    """A cache (v1), made by ``KvCacheManager``; ``per_device_tensor_addrs[d][i]`` = tensor ``i`` on device ``d``.

    On garbage collection a still-valid cache is handed to ``kv_cache_manager.deallocate_cache``
    when the manager is initialized; errors there are swallowed.
    """

    def __init__(self, cache_id: int, cache_desc: CacheDesc, per_device_tensor_addrs: List[List[int]],
                 kv_cache_manager: Any = None) -> None:
        """Made by ``KvCacheManager`` (or ``create_cpu_cache``), not by users.

        Args:
            cache_id: the engine's id of the cache (-1: a host cache of ``create_cpu_cache``).
            cache_desc: its description.
            per_device_tensor_addrs: per device, one address per tensor in this process.
            kv_cache_manager: the manager that made it (frees it on garbage collection).

        Raises:
            TypeError, ValueError: ``cache_id`` not an int64.
        """
        self._valid = False
        self._kv_cache_manager = kv_cache_manager
        v.check_int64("cache_id", cache_id)
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._per_device_tensor_addrs = per_device_tensor_addrs
        self._valid = True

    def __del__(self) -> None:
        manager = getattr(self, "_kv_cache_manager", None)
        if not getattr(self, "_valid", False) or manager is None:
            return
        try:
            if manager.is_initialized():
                manager.deallocate_cache(self)
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    @property
    def cache_id(self) -> int:
        """The engine's id of the cache (-1 for a host cache of ``create_cpu_cache``)."""
        return self._cache_id

    @property
    def cache_desc(self) -> CacheDesc:
        """The cache's ``CacheDesc``."""
        return self._cache_desc

    @property
    def per_device_tensor_addrs(self) -> List[List[int]]:
        """Per device (one here), one address per tensor; ``[]`` after deallocation."""
        return self._per_device_tensor_addrs

    @per_device_tensor_addrs.setter
    def per_device_tensor_addrs(self, addrs: List[List[int]]) -> None:
        """Internal: the cache manager clears it on deallocation."""
        self._per_device_tensor_addrs = addrs

    @classmethod
    def create_cpu_cache(cls, cache_desc: CacheDesc, addrs: Union[List[int], List[List[int]]]) -> "KvCache":
        """A host cache over user memory, for ``swap_blocks``.

        Args:
            cache_desc: HOST placement.
            addrs: one device's addresses (one per tensor), or a list of them per device.

        Returns:
            The ``KvCache`` (``cache_id`` -1).

        Raises:
            TypeError, ValueError: ``addrs`` not a list of uint64 (or of lists of them).
            LLMException: ``LLM_PARAM_INVALID`` (not HOST placement, empty, mixed, or not one address per tensor).
        """
        _check_cpu_desc(cache_desc)
        v.check_isinstance("addrs", addrs, [list], allow_none=False)
        v.raise_if_false(len(addrs) > 0, "addrs length should be bigger than zero.")
        first_type = list if isinstance(addrs[0], list) else int
        for addr in addrs:
            v.check_isinstance("the internal element of addrs", addr, [list, int], allow_none=False)
            v.raise_if_false(isinstance(addr, first_type),
                             "the type of the internal element of addrs should be consistent.")
            if isinstance(addr, list):
                v.check_isinstance("the internal element of addrs", addr, [list], inner_class=int)
                v.check_list_uint64("addrs", addr)
                v.raise_if_false(cache_desc.num_tensors == len(addr),
                                 f"cache_desc num_tensors:{cache_desc.num_tensors} "
                                 f"should be equal to size of the internal element of addrs:{len(addr)}")
            else:
                v.check_uint64("addrs", addr)
        if first_type is int:
            v.raise_if_false(cache_desc.num_tensors == len(addrs),
                             f"cache_desc num_tensors:{cache_desc.num_tensors} should be equal to size of addrs:"
                             f"{len(addrs)}")
            return cls(-1, cache_desc, [list(cast(List[int], addrs))], None)
        return cls(-1, cache_desc, [list(cast(List[int], a)) for a in addrs], None)

    def __repr__(self) -> str:
        return f"KvCache(cache_id = {self._cache_id}, num_devices = {len(self._per_device_tensor_addrs)})"


# ---- layer-wise transfer -------------------------------------------------------------------------


class LayerSynchronizer(ABC):
    """User hook of ``transfer_cache_async``: block until layer ``layer_index`` is computed."""

    @abstractmethod
    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        """Block until layer ``layer_index`` is computed.

        Args:
            layer_index: the layer about to be sent.
            timeout_in_millis: always None (CANN: not supported yet).

        Returns:
            True when the layer is ready; False aborts (its configs then fail with ``LLM_PARAM_INVALID``).

        Raises:
            Anything it raises aborts the transfer as False does.
        """


def _check_layer_range(name: str, layer_range: Optional[range], allow_none: bool = True) -> None:
    """A ``range`` with step 1 and ``0 <= start < stop`` (TypeError / LLMException)."""
    if allow_none and layer_range is None:
        return
    v.check_isinstance(name, layer_range, [range], allow_none=False)
    assert layer_range is not None   # checked just above (TypeError)
    v.raise_if_false(layer_range.step == 1, f"check {name}.step == 1 failed")
    v.raise_if_false(0 <= layer_range.start < layer_range.stop,
                     "check 0 <= range.start < range.stop failed, {0} = {1}", name, layer_range)


def layer_range_to_tensor_indices(layer_range: Optional[range], tensor_num_per_layer: int = 2) -> List[int]:
    """Layers ``[start, stop)`` -> tensor indices ``[start*N, stop*N)``; ``None`` -> ``[]`` (= all tensors)."""
    v.check_uint32("tensor_num_per_layer", tensor_num_per_layer)
    v.raise_if_false(tensor_num_per_layer > 0, "tensor_num_per_layer should be greater than zero.")
    if layer_range is None:
        return []
    _check_layer_range("layer_range", layer_range, allow_none=False)
    return list(range(layer_range.start * tensor_num_per_layer, layer_range.stop * tensor_num_per_layer))


#: K and V: the tensors of one layer (transfer_cache_async always moves both; tensor_num_per_layer's default)
TENSORS_PER_LAYER = 2


class TransferConfig:
    """Layer-wise push to raw remote addresses: ``dst_addrs`` holds 2 addresses (K, V) per layer.

    When ``src_layer_range`` is given, ``len(dst_addrs) == 2 * len(src_layer_range)`` is checked
    here already (CANN checks it in ``transfer_cache_async``); setters check each field alone, so
    fields can be changed one at a time, and ``transfer_cache_async`` checks them together again.
    """

    def __init__(self, dst_cluster_id: int, dst_addrs: List[int], src_layer_range: Optional[range] = None,
                 src_batch_index: int = 0) -> None:
        """A layer-wise push to raw remote addresses.

        Args:
            dst_cluster_id: the target cluster (uint64).
            dst_addrs: remote tensor addresses, 2 (K, V) per layer sent.
            src_layer_range: the layers to send (step 1; None: all).
            src_batch_index: the source batch slot (uint32).

        Raises:
            TypeError, ValueError: arguments of the wrong type or range.
            LLMException: ``LLM_PARAM_INVALID`` (``len(dst_addrs) != 2 * len(src_layer_range)``, a range of step other
                than 1).
        """
        v.check_uint64("dst_cluster_id", dst_cluster_id)
        self._check_dst_addrs(dst_addrs)
        _check_layer_range("src_layer_range", src_layer_range)
        v.check_uint32("src_batch_index", src_batch_index)
        if src_layer_range is not None:
            expected = TENSORS_PER_LAYER * len(src_layer_range)
            v.raise_if_false(len(dst_addrs) == expected, "expect {0} dst_addrs, but len(dst_addrs) = {1}, range = {2}",
                             expected, len(dst_addrs), src_layer_range)
        self._dst_cluster_id = dst_cluster_id
        self._dst_addrs = dst_addrs
        self._src_layer_range = src_layer_range
        self._src_batch_index = src_batch_index
        self.dst_layer_range: Optional[range] = None

    @staticmethod
    def _check_dst_addrs(dst_addrs: List[int]) -> None:
        v.check_isinstance("dst_addrs", dst_addrs, [list, tuple], inner_class=int, allow_none=False)
        v.check_list_uint64("dst_addrs", dst_addrs)

    @property
    def dst_cluster_id(self) -> int:
        """The target cluster."""
        return self._dst_cluster_id

    @dst_cluster_id.setter
    def dst_cluster_id(self, dst_cluster_id: int) -> None:
        v.check_uint64("dst_cluster_id", dst_cluster_id)
        self._dst_cluster_id = dst_cluster_id

    @property
    def dst_addrs(self) -> List[int]:
        """Remote tensor addresses, 2 per layer."""
        return self._dst_addrs

    @dst_addrs.setter
    def dst_addrs(self, dst_addrs: List[int]) -> None:
        self._check_dst_addrs(dst_addrs)
        self._dst_addrs = dst_addrs

    @property
    def src_layer_range(self) -> Optional[range]:
        """The layers to send (None: all)."""
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, src_layer_range: Optional[range]) -> None:
        _check_layer_range("src_layer_range", src_layer_range)
        self._src_layer_range = src_layer_range

    @property
    def src_batch_index(self) -> int:
        """The source batch slot."""
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, src_batch_index: int) -> None:
        v.check_uint32("src_batch_index", src_batch_index)
        self._src_batch_index = src_batch_index

    def __repr__(self) -> str:
        return (f"TransferConfig(dst_cluster_id={self._dst_cluster_id}, dst_addrs={self._dst_addrs}, "
                f"src_layer_range={self._src_layer_range}, src_batch_index={self._src_batch_index})")


class TransferWithCacheKeyConfig:
    """Layer-wise push to a remote cache named by key (remote-cache-accessible mode).

    Both ranges are required and of equal length; ``src_batch_index`` must be 0 for a
    ``BlocksCacheKey``. ``dst_cluster_id`` is ``cache_key.cluster_id``.
    """

    def __init__(self, cache_key: Union[BlocksCacheKey, CacheKeyByIdAndIndex], src_layer_range: Optional[range] = None,
                 dst_layer_range: Optional[range] = None, src_batch_index: int = 0) -> None:
        """A layer-wise push to a remote cache named by key (remote-cache-accessible mode).

        Args:
            cache_key: the remote cache: a ``BlocksCacheKey`` or a ``CacheKeyByIdAndIndex``.
            src_layer_range: the local layers (required, step 1).
            dst_layer_range: the remote layers (required, as long as ``src_layer_range``).
            src_batch_index: the source batch slot (0 for a ``BlocksCacheKey``).

        Raises:
            TypeError, ValueError: arguments of the wrong type or range.
            LLMException: ``LLM_PARAM_INVALID`` (ranges missing or of different lengths, a non-zero ``src_batch_index``
                with a
                ``BlocksCacheKey``).
        """
        v.check_isinstance("cache_key", cache_key, [BlocksCacheKey, CacheKeyByIdAndIndex], allow_none=False)
        _check_layer_range("src_layer_range", src_layer_range, allow_none=False)
        _check_layer_range("dst_layer_range", dst_layer_range, allow_none=False)
        assert src_layer_range is not None and dst_layer_range is not None   # checked just above (TypeError)
        v.raise_if_false(len(src_layer_range) == len(dst_layer_range),
                         "src_layer_range size should be equal to dst_layer_range size, {0} vs {1}",
                         src_layer_range, dst_layer_range)
        v.check_uint32("src_batch_index", src_batch_index)
        self._check_blocks_batch_index(cache_key, src_batch_index)
        self._cache_key = cache_key
        self._src_layer_range = src_layer_range
        self._dst_layer_range = dst_layer_range
        self._src_batch_index = src_batch_index

    @staticmethod
    def _check_blocks_batch_index(cache_key: Any, src_batch_index: int) -> None:
        v.raise_if_true(isinstance(cache_key, BlocksCacheKey) and src_batch_index != 0,
                        "src_batch_index should be 0 when cache_key is BlocksCacheKey.")

    @property
    def cache_key(self) -> Union[BlocksCacheKey, CacheKeyByIdAndIndex]:
        """The remote cache's key."""
        return self._cache_key

    @cache_key.setter
    def cache_key(self, cache_key: Union[BlocksCacheKey, CacheKeyByIdAndIndex]) -> None:
        v.check_isinstance("cache_key", cache_key, [BlocksCacheKey, CacheKeyByIdAndIndex], allow_none=False)
        self._check_blocks_batch_index(cache_key, self._src_batch_index)
        self._cache_key = cache_key

    @property
    def dst_cluster_id(self) -> int:
        """The target cluster: ``cache_key.cluster_id``."""
        return self._cache_key.cluster_id

    @property
    def src_layer_range(self) -> range:
        """The local layers to send."""
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, src_layer_range: range) -> None:
        _check_layer_range("src_layer_range", src_layer_range, allow_none=False)
        self._src_layer_range = src_layer_range

    @property
    def dst_layer_range(self) -> range:
        """The remote layers they go to."""
        return self._dst_layer_range

    @dst_layer_range.setter
    def dst_layer_range(self, dst_layer_range: range) -> None:
        _check_layer_range("dst_layer_range", dst_layer_range, allow_none=False)
        self._dst_layer_range = dst_layer_range

    @property
    def src_batch_index(self) -> int:
        """The source batch slot."""
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, src_batch_index: int) -> None:
        v.check_uint32("src_batch_index", src_batch_index)
        self._check_blocks_batch_index(self._cache_key, src_batch_index)
        self._src_batch_index = src_batch_index

    def __repr__(self) -> str:
        return (f"TransferWithCacheKeyConfig(cache_key={self._cache_key}, src_layer_range={self._src_layer_range}, "
                f"dst_layer_range={self._dst_layer_range}, src_batch_index={self._src_batch_index})")
