from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_PROMPT: _ClassVar[Role]
    ROLE_DECODER: _ClassVar[Role]
    ROLE_MIX: _ClassVar[Role]

class Placement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_HOST: _ClassVar[Placement]
    PLACEMENT_DEVICE: _ClassVar[Placement]
ROLE_UNSPECIFIED: Role
ROLE_PROMPT: Role
ROLE_DECODER: Role
ROLE_MIX: Role
PLACEMENT_HOST: Placement
PLACEMENT_DEVICE: Placement

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheDesc(_message.Message):
    __slots__ = ("num_tensors", "shape", "data_type", "placement")
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    num_tensors: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    data_type: int
    placement: Placement
    def __init__(self, num_tensors: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., data_type: _Optional[int] = ..., placement: _Optional[_Union[Placement, str]] = ...) -> None: ...

class CacheKey(_message.Message):
    __slots__ = ("cluster_id", "req_id", "model_id", "prefix_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    req_id: int
    model_id: int
    prefix_id: int
    def __init__(self, cluster_id: _Optional[int] = ..., req_id: _Optional[int] = ..., model_id: _Optional[int] = ..., prefix_id: _Optional[int] = ...) -> None: ...

class CacheKeyByIdAndIndex(_message.Message):
    __slots__ = ("cluster_id", "cache_id", "batch_index")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    cache_id: int
    batch_index: int
    def __init__(self, cluster_id: _Optional[int] = ..., cache_id: _Optional[int] = ..., batch_index: _Optional[int] = ...) -> None: ...

class BlocksCacheKey(_message.Message):
    __slots__ = ("cluster_id", "model_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    model_id: int
    def __init__(self, cluster_id: _Optional[int] = ..., model_id: _Optional[int] = ...) -> None: ...

class AnyKey(_message.Message):
    __slots__ = ("cache_key", "by_id", "blocks_key", "address")
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    BY_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cache_key: CacheKey
    by_id: CacheKeyByIdAndIndex
    blocks_key: BlocksCacheKey
    address: WorkerAddress
    def __init__(self, cache_key: _Optional[_Union[CacheKey, _Mapping]] = ..., by_id: _Optional[_Union[CacheKeyByIdAndIndex, _Mapping]] = ..., blocks_key: _Optional[_Union[BlocksCacheKey, _Mapping]] = ..., address: _Optional[_Union[WorkerAddress, _Mapping]] = ...) -> None: ...

class WorkerAddress(_message.Message):
    __slots__ = ("cluster_id", "addr", "block_size")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    addr: int
    block_size: int
    def __init__(self, cluster_id: _Optional[int] = ..., addr: _Optional[int] = ..., block_size: _Optional[int] = ...) -> None: ...

class LayerRange(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...
