"""The model API of CANN 8.0.RC2-8.2 (docs/spec.md §9): ``add_model`` -> ``LLMModel``, ``ModelConfig``, ``ModelRunner``,
``LLMReq``, ``check_capacity`` -> ``CapacityState``, ``complete_request``.

These names are not in the current package's ``__all__``; ``from llm_datadist import LLMReq`` works
through the package's module ``__getattr__``, as CANN re-exports its v1 names. CANN's code for this
API is not public; what its documentation leaves open is decided in ``docs/choices.md``. In short:

* the API lives on top of KvCacheManager mode (HIASCEND 8.1: "add_model ... in KvCacheManager mode");
  ``model_id`` counts the ``add_model`` calls of an ``LLMDataDist`` from 0 and is the ``model_id`` of
  every key the model makes;
* PROMPT ``predict`` allocates one cache of the model's KV shape, binds ``CacheKey(<this cluster>,
  req.req_id, model_id)`` to each request's batch slot, copies a preloaded prefix into the slot of a
  request whose ``prefix_id`` is set, runs ``run_model`` and drops its own reference: the KV stays
  until a decoder pulls it or ``complete_request`` releases it;
* DECODER: the model's batch cache is allocated by ``add_model`` (``on_cache_allocated``);
  ``pull_kv`` stages a request's KV in a one-slot cache, ``merge_kv`` copies it into a batch slot
  and frees the staging cache, ``pull_blocks`` treats the batch cache's rows as blocks,
  ``predict`` runs ``run_model`` on the batch cache;
* ``preload_prompt_prefix`` keeps a one-slot cache under ``CacheKey(prefix_id=...)``
  (LLM_PREFIX_ALREADY_EXIST when present); ``release_prompt_prefix`` frees it (LLM_PREFIX_NOT_EXIST).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from datadist.v1 import datadist_pb2

from . import _validate as v
from ._cache_ops import KIND_BLOCKS, PULL
from ._engine import EngineView
from .configs import LLMRole
from .data_type import DataType
from .llm_types import BlocksCacheKey, CacheDesc, CacheKey, KvCache, Placement
from .status import LLMException, LLMStatusCode

__all__ = ["LLMReq", "CapacityState", "ModelConfig", "ModelRunner", "LLMModel"]

log = logging.getLogger(__name__)

_INVALID_ID = 2**64 - 1


def _valid(ident: int) -> bool:
    return 0 <= ident < _INVALID_ID


class LLMReq:
    """One inference request: ``LLMReq(req_id=2**64-1, prompt_length=0, prompt_cluster_id=0,
    decoder_cluster_id=0, prefix_id=2**64-1)``; every field a uint64 with a checked setter."""

    def __init__(self, req_id: int = _INVALID_ID, prompt_length: int = 0, prompt_cluster_id: int = 0,
                 decoder_cluster_id: int = 0, prefix_id: int = _INVALID_ID) -> None:
        """A request; ``sequence_length`` starts at 0 (C++ ``LLMReq``'s field).

        Args:
            req_id: the request's id, the ``req_id`` of its ``CacheKey``; 2**64-1 (the default): none -- an idle slot
                of a DECODER batch.
            prompt_length: the prompt's tokens (``check_capacity`` takes it as ``seq_len``).
            prompt_cluster_id: the PROMPT node's cluster id (a DECODER pulls the KV from it).
            decoder_cluster_id: the DECODER node's cluster id.
            prefix_id: the common prefix the request starts with (``preload_prompt_prefix``); 2**64-1: none.

        Raises:
            TypeError, ValueError: a field that is not an int in the uint64 range (here and on every later
                assignment).
        """
        self.req_id = req_id
        self.prompt_length = prompt_length
        self.prompt_cluster_id = prompt_cluster_id
        self.decoder_cluster_id = decoder_cluster_id
        self.prefix_id = prefix_id
        self.sequence_length = 0

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("req_id", "prompt_length", "prompt_cluster_id", "decoder_cluster_id", "prefix_id",
                    "sequence_length"):
            v.check_uint64(name, value)
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        return (f"LLMReq(req_id={self.req_id}, prompt_length={self.prompt_length}, "
                f"prompt_cluster_id={self.prompt_cluster_id}, decoder_cluster_id={self.decoder_cluster_id}, "
                f"prefix_id={self.prefix_id})")


class CapacityState:
    """What ``check_capacity`` answers: ``is_available`` False means ``predict`` would run out of memory."""

    def __init__(self, is_available: bool, free_tokens_num: int, total_tokens_num: int) -> None:
        """Args:
            is_available: whether ``predict`` of the sequence length asked about fits in the free memory.
            free_tokens_num: tokens the free device memory holds, for every model added.
            total_tokens_num: tokens the whole device memory pool holds.
        """
        self._is_available = bool(is_available)
        self._free_tokens_num = int(free_tokens_num)
        self._total_tokens_num = int(total_tokens_num)

    @property
    def is_available(self) -> bool:
        """False: ``predict`` of the sequence length asked about would run out of memory."""
        return self._is_available

    @property
    def free_tokens_num(self) -> int:
        """Tokens the free device memory holds (for every model added: its KV bytes per token summed)."""
        return self._free_tokens_num

    @property
    def total_tokens_num(self) -> int:
        """Tokens the whole device memory pool holds, counted as ``free_tokens_num``."""
        return self._total_tokens_num

    def __repr__(self) -> str:
        return (f"CapacityState(is_available={self._is_available}, free_tokens_num={self._free_tokens_num}, "
                f"total_tokens_num={self._total_tokens_num})")


class ModelConfig:
    """The model's KV layout: ``kv_shapes`` (``"d0,d1,..."`` per KV tensor), ``kv_dtypes``, ``kv_seq_len_dim_index``.

    ``generate_options()`` -> ``llm.RefInputShapes`` (``;`` between tensors, ``,`` between dims),
    ``llm.RefInputDtypes`` (``;``-joined ``DataType`` values), ``llm.RefInputSeqLenDimIndex``.
    """

    def __init__(self) -> None:
        self._kv_shapes: List[str] = []
        self._kv_dtypes: List[DataType] = []
        self._kv_seq_len_dim_index: Optional[int] = None
        self._options: Dict[str, str] = {}

    @property
    def kv_shapes(self) -> List[str]:
        """One shape per KV tensor, ``"d0,d1,..."`` (e.g. ``["1,1024"] * 80``); set: a list or tuple of such strings
        (``LLMException`` ``LLM_PARAM_INVALID`` for one that is not comma-separated integers)."""
        return self._kv_shapes

    @kv_shapes.setter
    def kv_shapes(self, kv_shapes: List[str]) -> None:
        v.check_isinstance("kv_shapes", kv_shapes, [list, tuple], inner_class=str, allow_none=False)
        for shape in kv_shapes:
            dims = shape.split(",")
            v.raise_if_false(all(d.strip().lstrip("-").isdigit() for d in dims),
                             f'kv_shapes element "{shape}" is invalid, expected comma-separated integers')
        self._kv_shapes = list(kv_shapes)

    @property
    def kv_dtypes(self) -> List[DataType]:
        """One ``DataType`` per KV tensor; set: a list or tuple of ``DataType`` (``TypeError`` otherwise)."""
        return self._kv_dtypes

    @kv_dtypes.setter
    def kv_dtypes(self, kv_dtypes: List[DataType]) -> None:
        v.check_isinstance("kv_dtypes", kv_dtypes, [list, tuple], inner_class=DataType, allow_none=False)
        self._kv_dtypes = list(kv_dtypes)

    @property
    def kv_seq_len_dim_index(self) -> Optional[int]:
        """The dimension of a KV shape that is the sequence length (None: not set); set: an int32."""
        return self._kv_seq_len_dim_index

    @kv_seq_len_dim_index.setter
    def kv_seq_len_dim_index(self, index: int) -> None:
        v.check_int32("kv_seq_len_dim_index", index)
        self._kv_seq_len_dim_index = index

    def generate_options(self) -> Dict[str, str]:
        """The options ``LLMDataDist.add_model`` takes (``gen_options`` is the same method).

        Returns:
            ``llm.RefInputShapes`` (shapes joined by ``;``, their dims by ``,``), ``llm.RefInputDtypes`` (the
            ``DataType`` values joined by ``;``) and ``llm.RefInputSeqLenDimIndex``, each only once set -- the same
            dict on every call, updated.
        """
        if self._kv_shapes:
            self._options["llm.RefInputShapes"] = ";".join(s.replace(" ", "") for s in self._kv_shapes)
        if self._kv_dtypes:
            self._options["llm.RefInputDtypes"] = ";".join(str(dt.value) for dt in self._kv_dtypes)
        if self._kv_seq_len_dim_index is not None:
            self._options["llm.RefInputSeqLenDimIndex"] = str(self._kv_seq_len_dim_index)
        return self._options

    gen_options = generate_options


class ModelRunner:
    """Subclass it: ``predict`` / ``preload_prompt_prefix`` call ``run_model(kv_cache, inputs, **kwargs)``.

    The KV cache is a ``KvCache`` whose ``per_device_tensor_addrs[0]`` are this process's addresses of
    the KV tensors (``llm_datadist.views.numpy_views(kv_cache)`` gives arrays over them). The default
    ``run_model`` would run CANN's offline model, which datadist does not have: it raises.
    """

    def run_model(self, kv_cache: KvCache, input_tensors: Any, **kwargs: Any) -> Any:
        """Run the model over ``kv_cache``: what a subclass implements (``predict``, ``preload_prompt_prefix``).

        Args:
            kv_cache: the KV cache to read and fill: a PROMPT's request cache (one slot per request), its one-slot
                prefix cache, or a DECODER's batch cache.
            input_tensors: the ``inputs`` given to ``predict`` (a list or tuple of ``Tensor``).
            **kwargs: those given to ``predict``.

        Returns:
            What ``predict`` returns: the subclass's outputs.

        Raises:
            TypeError: ``input_tensors`` not a list or tuple of ``Tensor``.
            LLMException: ``LLM_FEATURE_NOT_ENABLED`` always, here: CANN's offline model is not part of datadist.
        """
        from .tensor import Tensor

        v.check_isinstance("inputs", input_tensors, [list, tuple], inner_class=Tensor, allow_none=False)
        raise LLMException("the default ModelRunner runs CANN's offline model, which datadist does not provide; "
                           "pass a ModelRunner subclass to add_model",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    def on_cache_allocated(self, kv_cache: KvCache) -> None:
        """DECODER: the model's batch cache was allocated (by ``add_model``); here nothing is done.

        Args:
            kv_cache: the batch cache.

        Raises:
            Nothing here; what a subclass's hook raises leaves ``add_model`` (the model is not added).
        """

    def on_cache_deallocated(self, kv_cache: KvCache) -> None:
        """DECODER: the model's batch cache is about to be freed (``LLMDataDist.finalize``); here nothing is done.

        Args:
            kv_cache: the batch cache.

        Raises:
            Nothing here; what a subclass's hook raises is logged and ``finalize`` goes on.
        """


def _parse_desc(options: Dict[str, str]) -> CacheDesc:
    """CANN's ``CacheDescParser.parse_by_options``, restricted to static shapes."""
    v.raise_if_false("llm.RefInputShapes" in options, "llm.RefInputShapes not set")
    shapes = options["llm.RefInputShapes"].split(";")
    v.raise_if_false(len(set(shapes)) == 1,
                     f"zero or multiple different shapes is not supported, llm.RefInputShapes = {shapes}")
    v.raise_if_false("llm.RefInputDtypes" in options, "llm.RefInputDtypes not set")
    dtypes = options["llm.RefInputDtypes"].split(";")
    v.raise_if_false(len(set(dtypes)) == 1,
                     f"zero or multiple different data types is not supported, llm.RefInputDtypes = {dtypes}")
    v.raise_if_false(len(shapes) == len(dtypes),
                     f"kv_shapes num ({len(shapes)}) mismatches that of kv_data_type ({len(dtypes)})")
    try:
        shape = [int(d) for d in shapes[0].split(",")]
    except ValueError:
        raise LLMException(f"llm.RefInputShapes {shapes[0]!r} is not a list of integers",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
    v.raise_if_false(len(shape) > 0 and all(d > 0 for d in shape),
                     f"kv shape {shape} must be static with positive dims (dynamic dims are not supported)")
    dtype = next((dt for dt in DataType if str(dt.value) == dtypes[0]), None)
    v.raise_if_false(dtype is not None, f"unsupported dtype: {dtypes[0]}")
    seq_dim = -1
    if "llm.RefInputSeqLenDimIndex" in options:
        seq_dim = int(options["llm.RefInputSeqLenDimIndex"])
        v.raise_if_false(0 <= seq_dim < len(shape), f"seq_len_dim_index ({seq_dim}) out of range, kv_shape = {shape}")
    return CacheDesc(len(shapes), shape, dtype, Placement.DEVICE, 0, seq_dim, options.get("llm.kvTensorFormat"))


def _one_slot(desc: CacheDesc) -> CacheDesc:
    return CacheDesc(desc.num_tensors, [1, *desc.shape[1:]], desc.data_type, Placement.DEVICE, 0,
                     desc.seq_len_dim_index, desc.kv_tensor_format)


def _req_list(llm_req: Any) -> List[LLMReq]:
    v.check_isinstance("llm_req", llm_req, [LLMReq, list, tuple], allow_none=False)
    reqs = [llm_req] if isinstance(llm_req, LLMReq) else list(llm_req)
    v.check_inner("llm_req", reqs, LLMReq)
    return reqs


class LLMModel:
    """Returned by ``LLMDataDist.add_model``; what it does depends on the node's role (module docstring)."""

    def __init__(self, owner: EngineView, model_id: int, desc: CacheDesc, runner: ModelRunner) -> None:
        """Made by ``LLMDataDist.add_model``, not by hand; a DECODER's allocates its batch cache here.

        Args:
            owner: the ``LLMDataDist`` it belongs to.
            model_id: its number among that ``LLMDataDist``'s models, from 0: the ``model_id`` of its keys.
            desc: the KV layout its options gave (``ModelConfig.generate_options``).
            runner: what runs the model (``ModelRunner.run_model``).
        """
        self._owner = owner
        self._model_id = model_id
        self._desc = desc
        self._runner = runner
        self._prefixes: Dict[int, KvCache] = {}
        self._staged: Dict[int, KvCache] = {}
        self._cache: Optional[KvCache] = None        # DECODER batch cache
        self._blocks_view: Optional[int] = None     # DECODER: cache id of its blocks view
        if self._role == LLMRole.DECODER:
            self._cache = self._kv.allocate_cache(desc)
            self._runner.on_cache_allocated(self._cache)

    @property
    def model_id(self) -> int:
        """Its number among its ``LLMDataDist``'s models, from 0: the ``model_id`` of every key it makes."""
        return self._model_id

    @property
    def _kv(self) -> Any:
        return self._owner.kv_cache_manager

    @property
    def _role(self) -> LLMRole:
        return self._owner._role

    def _require_role(self, func: str, decoder: bool) -> None:
        ok = (self._role == LLMRole.DECODER) == decoder
        v.raise_if_false(ok, "{0} is not supported by {1}", func, self._role)

    # ---- both roles ----------------------------------------------------------------------------

    def predict(self, llm_req: Union[LLMReq, List[LLMReq], Tuple[LLMReq, ...]], inputs: Any, **kwargs: Any) -> Any:
        """Run the model (``ModelRunner.run_model``) for a batch of requests.

        PROMPT: a request cache of the model's layout is allocated, each request's ``CacheKey(this cluster,
        req_id, model_id)`` bound to its slot, a preloaded prefix copied into the slot of a request naming one; the
        KV stays under those keys until a DECODER pulls it or ``complete_request`` releases it (nothing stays when
        ``run_model`` raises). DECODER: ``run_model`` runs on the batch cache.

        Args:
            llm_req: one ``LLMReq`` or a list or tuple of them: a DECODER's, exactly the batch size (idle slots are
                ``LLMReq()``, ``req_id`` 2**64-1); a PROMPT's, 1 to the batch size.
            inputs: handed to ``run_model`` as ``input_tensors``.
            **kwargs: handed to ``run_model``.

        Returns:
            What ``run_model`` returns.

        Raises:
            TypeError: ``llm_req`` is not an ``LLMReq`` or a list or tuple of them.
            LLMException: ``LLM_PARAM_INVALID`` (a request count the role does not take), ``LLM_PREFIX_NOT_EXIST``
                (a PROMPT request naming a prefix not preloaded), ``LLM_OUT_OF_MEMORY`` (no memory for the
                request cache), or what ``run_model`` raises.
        """
        reqs = _req_list(llm_req)
        batch = self._desc.shape[0]
        if self._role == LLMRole.DECODER:
            v.raise_if_false(len(reqs) == batch, f"DECODER predict needs {batch} requests (the batch size; idle "
                                                 f"slots are LLMReq(req_id=2**64-1)), got {len(reqs)}")
            assert self._cache is not None
            return self._runner.run_model(self._cache, inputs, **kwargs)
        v.raise_if_false(0 < len(reqs) <= batch, f"PROMPT predict takes 1 to {batch} requests, got {len(reqs)}")
        for req in reqs:
            if _valid(req.prefix_id):
                v.raise_if_false(req.prefix_id in self._prefixes, f"prefix {req.prefix_id} does not exist",
                                 status_code=LLMStatusCode.LLM_PREFIX_NOT_EXIST)
        keys = [CacheKey(self._owner.cluster_id, req.req_id, self._model_id) for req in reqs]
        cache = self._kv.allocate_cache(self._desc, keys)
        try:
            for i, req in enumerate(reqs):
                if _valid(req.prefix_id):
                    self._kv.copy_cache(cache, self._prefixes[req.prefix_id], i, 0)
            return self._runner.run_model(cache, inputs, **kwargs)
        except BaseException:
            for key in keys:  # no KV was produced: nothing for a decoder to pull
                if _valid(key.req_id):
                    self._kv.remove_cache_key(key)
            raise
        finally:
            self._kv.deallocate_cache(cache)  # the request keys keep the KV until pulled or completed

    # ---- PROMPT: prefixes ----------------------------------------------------------------------

    def preload_prompt_prefix(self, llm_req: LLMReq, inputs: Any, **kwargs: Any) -> None:
        """PROMPT: compute a common prefix's KV (``run_model`` on a one-slot cache) and keep it under
        ``CacheKey(prefix_id=llm_req.prefix_id)`` for the requests that name it (``predict``).

        Args:
            llm_req: a request whose ``prefix_id`` is set.
            inputs: handed to ``run_model`` as ``input_tensors``.
            **kwargs: handed to ``run_model``.

        Raises:
            TypeError: ``llm_req`` is not an ``LLMReq``.
            LLMException: ``LLM_PARAM_INVALID`` (a DECODER, or no ``prefix_id``), ``LLM_PREFIX_ALREADY_EXIST`` (that
                prefix is preloaded already), ``LLM_OUT_OF_MEMORY`` (no memory for it), or what ``run_model``
                raises (then nothing is kept).
        """
        v.check_isinstance("llm_req", llm_req, [LLMReq], allow_none=False)
        self._require_role("[preload_prompt_prefix]", decoder=False)
        v.raise_if_false(_valid(llm_req.prefix_id), "llm_req.prefix_id must be set to preload a prefix")
        v.raise_if_true(llm_req.prefix_id in self._prefixes, f"prefix {llm_req.prefix_id} already exists",
                        status_code=LLMStatusCode.LLM_PREFIX_ALREADY_EXIST)
        key = CacheKey(self._owner.cluster_id, _INVALID_ID, self._model_id, llm_req.prefix_id)
        cache = self._kv.allocate_cache(_one_slot(self._desc), [key])
        try:
            self._runner.run_model(cache, inputs, **kwargs)
        except BaseException:
            self._kv.remove_cache_key(key)
            self._kv.deallocate_cache(cache)
            raise
        self._prefixes[llm_req.prefix_id] = cache

    def release_prompt_prefix(self, llm_req: LLMReq) -> None:
        """PROMPT: free the prefix ``preload_prompt_prefix`` kept under ``llm_req.prefix_id``, and its key.

        Args:
            llm_req: a request naming the prefix (``prefix_id``).

        Raises:
            TypeError: ``llm_req`` is not an ``LLMReq``.
            LLMException: ``LLM_PARAM_INVALID`` (a DECODER), ``LLM_PREFIX_NOT_EXIST`` (no such prefix preloaded).
        """
        v.check_isinstance("llm_req", llm_req, [LLMReq], allow_none=False)
        self._require_role("[release_prompt_prefix]", decoder=False)
        cache = self._prefixes.pop(llm_req.prefix_id, None)
        v.raise_if_true(cache is None, f"prefix {llm_req.prefix_id} does not exist",
                        status_code=LLMStatusCode.LLM_PREFIX_NOT_EXIST)
        self._kv.remove_cache_key(CacheKey(self._owner.cluster_id, _INVALID_ID, self._model_id, llm_req.prefix_id))
        self._kv.deallocate_cache(cache)

    # ---- DECODER: pulls ------------------------------------------------------------------------

    def pull_kv(self, llm_req: LLMReq) -> None:
        """DECODER: pull the request's KV (``CacheKey(prompt_cluster_id, req_id, model_id)``) from the PROMPT node
        into a one-slot cache of its own, held until ``merge_kv`` or ``complete_request``.

        Args:
            llm_req: the request (``req_id`` and ``prompt_cluster_id`` set).

        Raises:
            TypeError: ``llm_req`` is not an ``LLMReq``.
            LLMException: ``LLM_PARAM_INVALID`` (a PROMPT, or no ``req_id``), ``LLM_REPEAT_REQUEST`` (its KV is pulled
                already and not merged), ``LLM_OUT_OF_MEMORY``, and ``KvCacheManager.pull_cache``'s:
                ``LLM_NOT_YET_LINK``, ``LLM_KV_CACHE_NOT_EXIST``, ``LLM_TIMEOUT``, ``LLM_LINK_FAILED``.
        """
        v.check_isinstance("llm_req", llm_req, [LLMReq], allow_none=False)
        self._require_role("[pull_kv]", decoder=True)
        v.raise_if_false(_valid(llm_req.req_id), "llm_req.req_id must be set to pull its KV")
        v.raise_if_true(llm_req.req_id in self._staged, f"the KV of request {llm_req.req_id} was already pulled; "
                                                          f"merge_kv or complete_request it first",
                        status_code=LLMStatusCode.LLM_REPEAT_REQUEST)
        staged = self._kv.allocate_cache(_one_slot(self._desc))
        try:
            self._kv.pull_cache(CacheKey(llm_req.prompt_cluster_id, llm_req.req_id, self._model_id), staged, 0)
        except BaseException:
            self._kv.deallocate_cache(staged)
            raise
        self._staged[llm_req.req_id] = staged

    def merge_kv(self, llm_req: LLMReq, batch_index: int, batch_id: int = 0) -> None:
        """DECODER: copy the request's KV ``pull_kv`` pulled into slot ``batch_index`` of the batch cache, and free
        the one-slot cache it was pulled into.

        Args:
            llm_req: the request ``pull_kv`` pulled.
            batch_index: the batch cache's slot (uint32, below the batch size).
            batch_id: the batch (uint32); the model has one: 0.

        Raises:
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (a PROMPT, ``batch_id`` not 0, ``batch_index`` out of range),
                ``LLM_KV_CACHE_NOT_EXIST`` (no KV of that request pulled).
        """
        v.check_isinstance("llm_req", llm_req, [LLMReq], allow_none=False)
        v.check_uint32("batch_index", batch_index)
        v.check_uint32("batch_id", batch_id)
        self._require_role("[merge_kv]", decoder=True)
        v.raise_if_false(batch_id == 0, f"batch_id {batch_id} out of range: the model has one batch")
        v.raise_if_false(batch_index < self._desc.shape[0],
                         f"batch_index {batch_index} out of range [0, {self._desc.shape[0]})")
        staged = self._staged.get(llm_req.req_id)
        v.raise_if_true(staged is None, f"no pulled KV of request {llm_req.req_id} to merge",
                        status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        assert self._cache is not None and staged is not None
        self._kv.copy_cache(self._cache, staged, batch_index, 0)
        del self._staged[llm_req.req_id]
        self._kv.deallocate_cache(staged)

    def pull_blocks(self, llm_req: LLMReq, prompt_blocks: Sequence[int] = (), decoder_blocks: Sequence[int] = ()
                    ) -> None:
        """DECODER, PagedAttention: pull the request's KV into blocks (rows) of the batch cache.

        Empty ``prompt_blocks``: the prompt's contiguous request KV (``CacheKey``) fills ``decoder_blocks``
        in order; otherwise blocks of the prompt's blocks cache bound to ``BlocksCacheKey(model_id)``.

        Args:
            llm_req: the request (``prompt_cluster_id``; ``req_id`` when ``prompt_blocks`` is empty).
            prompt_blocks: the PROMPT's block numbers, or empty: its contiguous request KV.
            decoder_blocks: the batch cache's rows to fill (not empty; as many as ``prompt_blocks`` when it is not).

        Raises:
            TypeError: an argument of the wrong type.
            LLMException: ``LLM_PARAM_INVALID`` (a PROMPT, no ``decoder_blocks``, lists of different lengths, a block
                out of range), and ``KvCacheManager.pull_blocks``'s: ``LLM_NOT_YET_LINK``, ``LLM_KV_CACHE_NOT_EXIST``,
                ``LLM_TIMEOUT``, ``LLM_LINK_FAILED``.
        """
        v.check_isinstance("llm_req", llm_req, [LLMReq], allow_none=False)
        v.check_isinstance("prompt_blocks", prompt_blocks, [list, tuple], inner_class=int, allow_none=False)
        v.check_isinstance("decoder_blocks", decoder_blocks, [list, tuple], inner_class=int, allow_none=False)
        self._require_role("[pull_blocks]", decoder=True)
        v.raise_if_false(len(decoder_blocks) > 0, "decoder_blocks can not be empty.")
        kv = self._kv
        if prompt_blocks:
            v.raise_if_false(len(prompt_blocks) == len(decoder_blocks),
                             "Param prompt_blocks and decoder_blocks size should be same.")
            src: Any = BlocksCacheKey(llm_req.prompt_cluster_id, self._model_id)
        else:
            src = CacheKey(llm_req.prompt_cluster_id, llm_req.req_id, self._model_id)
            kv.check_cache_key(src)
        req = kv._request(PULL, KIND_BLOCKS, src, self._blocks_cache_id(), list(prompt_blocks),
                          list(decoder_blocks), 0, -1, None, None, 2)
        kv._transfer_checked("pull_blocks", req)

    def _blocks_cache_id(self) -> int:
        """The batch cache seen as a blocks cache: a second (registered) view of the same memory."""
        if self._blocks_view is None:
            assert self._cache is not None
            addrs = self._cache.per_device_tensor_addrs[0]
            info = self._kv._register_rpc("pull_blocks", self._desc, addrs, True, remote_accessible=True)
            self._blocks_view = info.cache_id
        return self._blocks_view

    # ---- request life cycle --------------------------------------------------------------------

    def _complete(self, req: LLMReq) -> None:
        if not _valid(req.req_id):
            return
        if self._role == LLMRole.DECODER:
            staged = self._staged.pop(req.req_id, None)
            if staged is not None:
                self._kv.deallocate_cache(staged)
        else:
            self._kv.remove_cache_key(CacheKey(self._owner.cluster_id, req.req_id, self._model_id))

    def _close(self) -> None:
        if self._cache is not None:
            try:
                self._runner.on_cache_deallocated(self._cache)
            except Exception:  # noqa: BLE001 - a user hook during finalize
                log.exception("on_cache_deallocated raised")


# ---- LLMDataDist entry points (llm_datadist.py delegates here) ----------------------------------


def add_model(owner: EngineView, model_options: Dict[str, str], model_runner: Optional[ModelRunner]) -> LLMModel:
    """``LLMDataDist.add_model``'s body: a new ``LLMModel`` of ``owner``, numbered by the models it has.

    Args:
        owner: the initialized ``LLMDataDist``.
        model_options: the model's options (``ModelConfig.generate_options()``): ``llm.RefInputShapes`` and
            ``llm.RefInputDtypes`` required, ``llm.RefInputSeqLenDimIndex`` optional.
        model_runner: what runs the model; None: a ``ModelRunner`` whose ``run_model`` raises.

    Returns:
        The ``LLMModel``, appended to ``owner``'s models (a DECODER's has its batch cache allocated).

    Raises:
        TypeError: ``model_options`` not a ``dict[str, str]``, ``model_runner`` not a ``ModelRunner``.
        LLMException: ``LLM_PARAM_INVALID`` (cache-manager mode; options missing, or naming several shapes or
            dtypes, a non-static shape, an unknown dtype, a sequence dimension out of range); a DECODER's
            ``allocate_cache`` status (e.g. ``LLM_OUT_OF_MEMORY``).
    """
    v.check_dict("model_options", model_options, str, str, allow_none=False)
    v.check_isinstance("model_runner", model_runner, [ModelRunner])
    v.raise_if_true(owner._enable_cache_manager, "add_model is only supported in KvCacheManager mode "
                                                 "(enable_cache_manager must not be set)")
    model = LLMModel(owner, len(owner._models), _parse_desc(model_options), model_runner or ModelRunner())
    owner._models.append(model)
    return model


def _tokens(desc: CacheDesc) -> int:
    """Tokens one cache of ``desc`` holds: batch x sequence length (dim ``seq_len_dim_index``, else dim 1)."""
    seq_dim = desc.seq_len_dim_index if desc.seq_len_dim_index > 0 else (1 if len(desc.shape) > 1 else 0)
    return desc.shape[0] * (desc.shape[seq_dim] if seq_dim else 1)


def check_capacity(owner: EngineView, seq_len: int) -> CapacityState:
    """``LLMDataDist.check_capacity``'s body: whether ``seq_len`` tokens fit in the free DEVICE pool memory, counted
    for every model ``owner`` added (its KV bytes per token summed), with room for one cache of each model.

    Args:
        owner: the initialized PROMPT ``LLMDataDist``.
        seq_len: tokens, >= 0.

    Returns:
        A ``CapacityState`` (free and total tokens of the engine's DEVICE pools).

    Raises:
        TypeError, ValueError: ``seq_len`` not an int in the uint64 range.
        LLMException: ``LLM_PARAM_INVALID`` (not PROMPT, no model added); the status of the daemon's ``GetStatus``
            when it fails.
    """
    v.check_uint64("seq_len", seq_len)
    v.raise_if_false(owner._role == LLMRole.PROMPT, "check_capacity is supported by PROMPT only")
    v.raise_if_false(len(owner._models) > 0, "check_capacity needs a model (add_model)")
    status = owner._call("GetStatus", datadist_pb2.StatusRequest(engine_id=owner._engine_id), "check_capacity")
    pools = [p for e in status.engines for p in e.pools if p.placement == int(Placement.DEVICE)]
    capacity = sum(p.capacity for p in pools)
    free = capacity - sum(p.used for p in pools)
    per_token = sum(math.ceil(m._desc.size * m._desc.num_tensors / _tokens(m._desc)) for m in owner._models)
    need = sum(m._desc.size * m._desc.num_tensors for m in owner._models)  # one predict: one cache per model
    total_tokens, free_tokens = capacity // per_token, free // per_token
    return CapacityState(seq_len <= free_tokens and free >= need, free_tokens, total_tokens)


def complete_request(owner: Any, llm_req: LLMReq) -> None:
    """``LLMDataDist.complete_request``'s body: each model of ``owner`` releases what ``llm_req`` holds -- PROMPT: the
    key of its KV (``remove_cache_key``), DECODER: its staged cache (``deallocate_cache``); nothing for a request
    without a valid ``req_id``.

    Args:
        owner: the initialized ``LLMDataDist``.
        llm_req: the ``LLMReq``.

    Raises:
        TypeError: ``llm_req`` not an ``LLMReq``.
        LLMException: the status of ``remove_cache_key`` / ``deallocate_cache`` (e.g. ``LLM_PARAM_INVALID``).
    """
    v.check_isinstance("llm_req", llm_req, [LLMReq], allow_none=False)
    for model in owner._models:
        model._complete(llm_req)
