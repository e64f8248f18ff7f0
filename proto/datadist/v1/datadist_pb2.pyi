from datadist.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransferKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSFER_CACHE: _ClassVar[TransferKind]
    TRANSFER_BLOCKS: _ClassVar[TransferKind]
TRANSFER_CACHE: TransferKind
TRANSFER_BLOCKS: TransferKind

class EngineRef(_message.Message):
    __slots__ = ("engine_id",)
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    def __init__(self, engine_id: _Optional[int] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("cluster_id", "role", "options", "pid")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    role: _common_pb2.Role
    options: _containers.ScalarMap[str, str]
    pid: int
    def __init__(self, cluster_id: _Optional[int] = ..., role: _Optional[_Union[_common_pb2.Role, str]] = ..., options: _Optional[_Mapping[str, str]] = ..., pid: _Optional[int] = ...) -> None: ...

class InitResponse(_message.Message):
    __slots__ = ("engine_id", "daemon_version", "listen_address", "pid_challenge", "device_id")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    DAEMON_VERSION_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    daemon_version: str
    listen_address: str
    pid_challenge: bytes
    device_id: int
    def __init__(self, engine_id: _Optional[int] = ..., daemon_version: _Optional[str] = ..., listen_address: _Optional[str] = ..., pid_challenge: _Optional[bytes] = ..., device_id: _Optional[int] = ...) -> None: ...

class ProvePidRequest(_message.Message):
    __slots__ = ("engine_id", "address")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    address: int
    def __init__(self, engine_id: _Optional[int] = ..., address: _Optional[int] = ...) -> None: ...

class SharedExport(_message.Message):
    __slots__ = ("path", "file_offset", "length", "pool")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    path: str
    file_offset: int
    length: int
    pool: str
    def __init__(self, path: _Optional[str] = ..., file_offset: _Optional[int] = ..., length: _Optional[int] = ..., pool: _Optional[str] = ...) -> None: ...

class WorkerMemory(_message.Message):
    __slots__ = ("shared_file", "process", "attached")
    SHARED_FILE_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    shared_file: SharedFileMemory
    process: ProcessMemory
    attached: AttachedMemory
    def __init__(self, shared_file: _Optional[_Union[SharedFileMemory, _Mapping]] = ..., process: _Optional[_Union[ProcessMemory, _Mapping]] = ..., attached: _Optional[_Union[AttachedMemory, _Mapping]] = ...) -> None: ...

class AttachedMemory(_message.Message):
    __slots__ = ("memory_id",)
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    memory_id: int
    def __init__(self, memory_id: _Optional[int] = ...) -> None: ...

class SharedFileMemory(_message.Message):
    __slots__ = ("path", "file_offset", "length")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    path: str
    file_offset: int
    length: int
    def __init__(self, path: _Optional[str] = ..., file_offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ProcessMemory(_message.Message):
    __slots__ = ("pid", "address", "length")
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    pid: int
    address: int
    length: int
    def __init__(self, pid: _Optional[int] = ..., address: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class CacheInfo(_message.Message):
    __slots__ = ("cache_id", "desc", "is_blocks", "registered", "remote_accessible", "tensors", "keys")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ACCESSIBLE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    desc: _common_pb2.CacheDesc
    is_blocks: bool
    registered: bool
    remote_accessible: bool
    tensors: _containers.RepeatedCompositeFieldContainer[SharedExport]
    keys: _containers.RepeatedCompositeFieldContainer[_common_pb2.AnyKey]
    def __init__(self, cache_id: _Optional[int] = ..., desc: _Optional[_Union[_common_pb2.CacheDesc, _Mapping]] = ..., is_blocks: _Optional[bool] = ..., registered: _Optional[bool] = ..., remote_accessible: _Optional[bool] = ..., tensors: _Optional[_Iterable[_Union[SharedExport, _Mapping]]] = ..., keys: _Optional[_Iterable[_Union[_common_pb2.AnyKey, _Mapping]]] = ...) -> None: ...

class AllocateCacheRequest(_message.Message):
    __slots__ = ("engine_id", "desc", "is_blocks", "cache_keys", "blocks_key")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEYS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    desc: _common_pb2.CacheDesc
    is_blocks: bool
    cache_keys: _containers.RepeatedCompositeFieldContainer[_common_pb2.CacheKey]
    blocks_key: _common_pb2.BlocksCacheKey
    def __init__(self, engine_id: _Optional[int] = ..., desc: _Optional[_Union[_common_pb2.CacheDesc, _Mapping]] = ..., is_blocks: _Optional[bool] = ..., cache_keys: _Optional[_Iterable[_Union[_common_pb2.CacheKey, _Mapping]]] = ..., blocks_key: _Optional[_Union[_common_pb2.BlocksCacheKey, _Mapping]] = ...) -> None: ...

class RegisterCacheRequest(_message.Message):
    __slots__ = ("engine_id", "desc", "is_blocks", "tensors", "cache_keys", "blocks_key", "remote_accessible", "worker_addrs")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEYS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ACCESSIBLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    desc: _common_pb2.CacheDesc
    is_blocks: bool
    tensors: _containers.RepeatedCompositeFieldContainer[WorkerMemory]
    cache_keys: _containers.RepeatedCompositeFieldContainer[_common_pb2.CacheKey]
    blocks_key: _common_pb2.BlocksCacheKey
    remote_accessible: bool
    worker_addrs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, engine_id: _Optional[int] = ..., desc: _Optional[_Union[_common_pb2.CacheDesc, _Mapping]] = ..., is_blocks: _Optional[bool] = ..., tensors: _Optional[_Iterable[_Union[WorkerMemory, _Mapping]]] = ..., cache_keys: _Optional[_Iterable[_Union[_common_pb2.CacheKey, _Mapping]]] = ..., blocks_key: _Optional[_Union[_common_pb2.BlocksCacheKey, _Mapping]] = ..., remote_accessible: _Optional[bool] = ..., worker_addrs: _Optional[_Iterable[int]] = ...) -> None: ...

class CacheRef(_message.Message):
    __slots__ = ("engine_id", "cache_id", "is_blocks")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    cache_id: int
    is_blocks: bool
    def __init__(self, engine_id: _Optional[int] = ..., cache_id: _Optional[int] = ..., is_blocks: _Optional[bool] = ...) -> None: ...

class RemoveCacheKeyRequest(_message.Message):
    __slots__ = ("engine_id", "cache_key")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    cache_key: _common_pb2.CacheKey
    def __init__(self, engine_id: _Optional[int] = ..., cache_key: _Optional[_Union[_common_pb2.CacheKey, _Mapping]] = ...) -> None: ...

class CacheOperand(_message.Message):
    __slots__ = ("cache_id", "desc", "tensors")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    desc: _common_pb2.CacheDesc
    tensors: _containers.RepeatedCompositeFieldContainer[WorkerMemory]
    def __init__(self, cache_id: _Optional[int] = ..., desc: _Optional[_Union[_common_pb2.CacheDesc, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[WorkerMemory, _Mapping]]] = ...) -> None: ...

class CopyCacheRequest(_message.Message):
    __slots__ = ("engine_id", "dst_cache_id", "src_cache_id", "dst_batch_index", "src_batch_index", "offset", "size")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    DST_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    DST_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    SRC_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    dst_cache_id: int
    src_cache_id: int
    dst_batch_index: int
    src_batch_index: int
    offset: int
    size: int
    def __init__(self, engine_id: _Optional[int] = ..., dst_cache_id: _Optional[int] = ..., src_cache_id: _Optional[int] = ..., dst_batch_index: _Optional[int] = ..., src_batch_index: _Optional[int] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class CopyBlocksRequest(_message.Message):
    __slots__ = ("engine_id", "cache_id", "copies")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    cache_id: int
    copies: _containers.RepeatedCompositeFieldContainer[BlockCopy]
    def __init__(self, engine_id: _Optional[int] = ..., cache_id: _Optional[int] = ..., copies: _Optional[_Iterable[_Union[BlockCopy, _Mapping]]] = ...) -> None: ...

class BlockCopy(_message.Message):
    __slots__ = ("src_block", "dst_blocks")
    SRC_BLOCK_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    src_block: int
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, src_block: _Optional[int] = ..., dst_blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class SwapBlocksRequest(_message.Message):
    __slots__ = ("engine_id", "src", "dst", "src_to_dst")
    class SrcToDstEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_TO_DST_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    src: CacheOperand
    dst: CacheOperand
    src_to_dst: _containers.ScalarMap[int, int]
    def __init__(self, engine_id: _Optional[int] = ..., src: _Optional[_Union[CacheOperand, _Mapping]] = ..., dst: _Optional[_Union[CacheOperand, _Mapping]] = ..., src_to_dst: _Optional[_Mapping[int, int]] = ...) -> None: ...

class IpPort(_message.Message):
    __slots__ = ("ip", "port")
    IP_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ip: str
    port: int
    def __init__(self, ip: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class ClusterLink(_message.Message):
    __slots__ = ("remote_cluster_id", "local_ip_info", "remote_ip_info")
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_IP_INFO_FIELD_NUMBER: _ClassVar[int]
    REMOTE_IP_INFO_FIELD_NUMBER: _ClassVar[int]
    remote_cluster_id: int
    local_ip_info: _containers.RepeatedCompositeFieldContainer[IpPort]
    remote_ip_info: _containers.RepeatedCompositeFieldContainer[IpPort]
    def __init__(self, remote_cluster_id: _Optional[int] = ..., local_ip_info: _Optional[_Iterable[_Union[IpPort, _Mapping]]] = ..., remote_ip_info: _Optional[_Iterable[_Union[IpPort, _Mapping]]] = ...) -> None: ...

class LinkClustersRequest(_message.Message):
    __slots__ = ("engine_id", "clusters", "timeout_ms")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterLink]
    timeout_ms: int
    def __init__(self, engine_id: _Optional[int] = ..., clusters: _Optional[_Iterable[_Union[ClusterLink, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class UnlinkClustersRequest(_message.Message):
    __slots__ = ("engine_id", "clusters", "timeout_ms", "force")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterLink]
    timeout_ms: int
    force: bool
    def __init__(self, engine_id: _Optional[int] = ..., clusters: _Optional[_Iterable[_Union[ClusterLink, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class LinkClustersResponse(_message.Message):
    __slots__ = ("status", "statuses", "reasons")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    status: int
    statuses: _containers.RepeatedScalarFieldContainer[int]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[int] = ..., statuses: _Optional[_Iterable[int]] = ..., reasons: _Optional[_Iterable[str]] = ...) -> None: ...

class SwitchRoleRequest(_message.Message):
    __slots__ = ("engine_id", "role", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    role: _common_pb2.Role
    options: _containers.ScalarMap[str, str]
    def __init__(self, engine_id: _Optional[int] = ..., role: _Optional[_Union[_common_pb2.Role, str]] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TransferRequest(_message.Message):
    __slots__ = ("engine_id", "kind", "remote", "local_cache_id", "remote_blocks", "local_blocks", "local_batch_index", "size", "src_layer_range", "dst_layer_range", "tensor_num_per_layer", "timeout_ms", "src_cache_offset", "dst_cache_offset", "exclusive")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SRC_LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    DST_LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_NUM_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SRC_CACHE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DST_CACHE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    kind: TransferKind
    remote: _common_pb2.AnyKey
    local_cache_id: int
    remote_blocks: _containers.RepeatedScalarFieldContainer[int]
    local_blocks: _containers.RepeatedScalarFieldContainer[int]
    local_batch_index: int
    size: int
    src_layer_range: _common_pb2.LayerRange
    dst_layer_range: _common_pb2.LayerRange
    tensor_num_per_layer: int
    timeout_ms: int
    src_cache_offset: int
    dst_cache_offset: int
    exclusive: bool
    def __init__(self, engine_id: _Optional[int] = ..., kind: _Optional[_Union[TransferKind, str]] = ..., remote: _Optional[_Union[_common_pb2.AnyKey, _Mapping]] = ..., local_cache_id: _Optional[int] = ..., remote_blocks: _Optional[_Iterable[int]] = ..., local_blocks: _Optional[_Iterable[int]] = ..., local_batch_index: _Optional[int] = ..., size: _Optional[int] = ..., src_layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., dst_layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., tensor_num_per_layer: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., src_cache_offset: _Optional[int] = ..., dst_cache_offset: _Optional[int] = ..., exclusive: _Optional[bool] = ...) -> None: ...

class TransferResponse(_message.Message):
    __slots__ = ("bytes", "transport")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    transport: str
    def __init__(self, bytes: _Optional[int] = ..., transport: _Optional[str] = ...) -> None: ...

class WorkerAddrsRequest(_message.Message):
    __slots__ = ("engine_id", "cache_id", "addrs")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    cache_id: int
    addrs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, engine_id: _Optional[int] = ..., cache_id: _Optional[int] = ..., addrs: _Optional[_Iterable[int]] = ...) -> None: ...

class LinkStatusRequest(_message.Message):
    __slots__ = ("engine_id", "remote_cluster_id", "timeout_ms")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    remote_cluster_id: int
    timeout_ms: int
    def __init__(self, engine_id: _Optional[int] = ..., remote_cluster_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class LayerTransferTarget(_message.Message):
    __slots__ = ("dst_cluster_id", "cache_key", "dst_addrs", "src_layer_range", "dst_layer_range", "src_batch_index")
    DST_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    DST_ADDRS_FIELD_NUMBER: _ClassVar[int]
    SRC_LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    DST_LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    SRC_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    dst_cluster_id: int
    cache_key: _common_pb2.AnyKey
    dst_addrs: _containers.RepeatedScalarFieldContainer[int]
    src_layer_range: _common_pb2.LayerRange
    dst_layer_range: _common_pb2.LayerRange
    src_batch_index: int
    def __init__(self, dst_cluster_id: _Optional[int] = ..., cache_key: _Optional[_Union[_common_pb2.AnyKey, _Mapping]] = ..., dst_addrs: _Optional[_Iterable[int]] = ..., src_layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., dst_layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., src_batch_index: _Optional[int] = ...) -> None: ...

class LayerTransferStart(_message.Message):
    __slots__ = ("engine_id", "src_cache_id", "targets", "src_block_indices", "dst_block_indices", "dst_block_memory_size", "timeout_ms")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_MEMORY_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    src_cache_id: int
    targets: _containers.RepeatedCompositeFieldContainer[LayerTransferTarget]
    src_block_indices: _containers.RepeatedScalarFieldContainer[int]
    dst_block_indices: _containers.RepeatedScalarFieldContainer[int]
    dst_block_memory_size: int
    timeout_ms: int
    def __init__(self, engine_id: _Optional[int] = ..., src_cache_id: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[LayerTransferTarget, _Mapping]]] = ..., src_block_indices: _Optional[_Iterable[int]] = ..., dst_block_indices: _Optional[_Iterable[int]] = ..., dst_block_memory_size: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class LayerTransferRequest(_message.Message):
    __slots__ = ("start", "ready_layer", "abort_layer")
    START_FIELD_NUMBER: _ClassVar[int]
    READY_LAYER_FIELD_NUMBER: _ClassVar[int]
    ABORT_LAYER_FIELD_NUMBER: _ClassVar[int]
    start: LayerTransferStart
    ready_layer: int
    abort_layer: int
    def __init__(self, start: _Optional[_Union[LayerTransferStart, _Mapping]] = ..., ready_layer: _Optional[int] = ..., abort_layer: _Optional[int] = ...) -> None: ...

class LayerTransferEvent(_message.Message):
    __slots__ = ("target", "layer", "status", "final", "message", "accepted")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    target: int
    layer: int
    status: int
    final: bool
    message: str
    accepted: bool
    def __init__(self, target: _Optional[int] = ..., layer: _Optional[int] = ..., status: _Optional[int] = ..., final: _Optional[bool] = ..., message: _Optional[str] = ..., accepted: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("engine_id",)
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    def __init__(self, engine_id: _Optional[int] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("placement", "capacity", "used")
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    placement: _common_pb2.Placement
    capacity: int
    used: int
    def __init__(self, placement: _Optional[_Union[_common_pb2.Placement, str]] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ...) -> None: ...

class EngineStatus(_message.Message):
    __slots__ = ("engine_id", "cluster_id", "role", "listen_address", "caches", "links", "pools", "pid", "uid")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    cluster_id: int
    role: _common_pb2.Role
    listen_address: str
    caches: int
    links: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    pid: int
    uid: int
    def __init__(self, engine_id: _Optional[int] = ..., cluster_id: _Optional[int] = ..., role: _Optional[_Union[_common_pb2.Role, str]] = ..., listen_address: _Optional[str] = ..., caches: _Optional[int] = ..., links: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ...) -> None: ...

class DaemonStatus(_message.Message):
    __slots__ = ("version", "backend", "transport", "uptime_seconds", "socket", "engines", "peer_security")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOCKET_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    PEER_SECURITY_FIELD_NUMBER: _ClassVar[int]
    version: str
    backend: str
    transport: str
    uptime_seconds: float
    socket: str
    engines: _containers.RepeatedCompositeFieldContainer[EngineStatus]
    peer_security: str
    def __init__(self, version: _Optional[str] = ..., backend: _Optional[str] = ..., transport: _Optional[str] = ..., uptime_seconds: _Optional[float] = ..., socket: _Optional[str] = ..., engines: _Optional[_Iterable[_Union[EngineStatus, _Mapping]]] = ..., peer_security: _Optional[str] = ...) -> None: ...

class LinkInfo(_message.Message):
    __slots__ = ("engine_id", "local_cluster_id", "remote_cluster_id", "state", "transport", "peer_address", "data_endpoint", "streams", "initiator", "bytes_in", "bytes_out")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    INITIATOR_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    local_cluster_id: int
    remote_cluster_id: int
    state: str
    transport: str
    peer_address: str
    data_endpoint: str
    streams: int
    initiator: bool
    bytes_in: int
    bytes_out: int
    def __init__(self, engine_id: _Optional[int] = ..., local_cluster_id: _Optional[int] = ..., remote_cluster_id: _Optional[int] = ..., state: _Optional[str] = ..., transport: _Optional[str] = ..., peer_address: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., streams: _Optional[int] = ..., initiator: _Optional[bool] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ...) -> None: ...

class LinkList(_message.Message):
    __slots__ = ("links",)
    LINKS_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[LinkInfo]
    def __init__(self, links: _Optional[_Iterable[_Union[LinkInfo, _Mapping]]] = ...) -> None: ...

class CacheList(_message.Message):
    __slots__ = ("engines",)
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[EngineCaches]
    def __init__(self, engines: _Optional[_Iterable[_Union[EngineCaches, _Mapping]]] = ...) -> None: ...

class EngineCaches(_message.Message):
    __slots__ = ("engine_id", "cluster_id", "caches")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    cluster_id: int
    caches: _containers.RepeatedCompositeFieldContainer[CacheInfo]
    def __init__(self, engine_id: _Optional[int] = ..., cluster_id: _Optional[int] = ..., caches: _Optional[_Iterable[_Union[CacheInfo, _Mapping]]] = ...) -> None: ...

class CommMember(_message.Message):
    __slots__ = ("cluster_id", "rank")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    rank: int
    def __init__(self, cluster_id: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class CommLinkRequest(_message.Message):
    __slots__ = ("engine_id", "comm_name", "members", "rank_table")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    COMM_NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    RANK_TABLE_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    comm_name: str
    members: _containers.RepeatedCompositeFieldContainer[CommMember]
    rank_table: str
    def __init__(self, engine_id: _Optional[int] = ..., comm_name: _Optional[str] = ..., members: _Optional[_Iterable[_Union[CommMember, _Mapping]]] = ..., rank_table: _Optional[str] = ...) -> None: ...

class CommLinkResponse(_message.Message):
    __slots__ = ("comm_id",)
    COMM_ID_FIELD_NUMBER: _ClassVar[int]
    comm_id: int
    def __init__(self, comm_id: _Optional[int] = ...) -> None: ...

class CommRef(_message.Message):
    __slots__ = ("engine_id", "comm_id")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    COMM_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    comm_id: int
    def __init__(self, engine_id: _Optional[int] = ..., comm_id: _Optional[int] = ...) -> None: ...

class RegisterMemStatusResponse(_message.Message):
    __slots__ = ("status", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: int
    detail: str
    def __init__(self, status: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ExtentTransferRequest(_message.Message):
    __slots__ = ("engine_id", "remote_cluster_id", "write", "extents", "timeout_ms")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    remote_cluster_id: int
    write: bool
    extents: bytes
    timeout_ms: int
    def __init__(self, engine_id: _Optional[int] = ..., remote_cluster_id: _Optional[int] = ..., write: _Optional[bool] = ..., extents: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class NotifyRequest(_message.Message):
    __slots__ = ("engine_id", "remote_cluster_id", "name", "msg", "timeout_ms")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    remote_cluster_id: int
    name: bytes
    msg: bytes
    timeout_ms: int
    def __init__(self, engine_id: _Optional[int] = ..., remote_cluster_id: _Optional[int] = ..., name: _Optional[bytes] = ..., msg: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Notify(_message.Message):
    __slots__ = ("name", "msg")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    msg: bytes
    def __init__(self, name: _Optional[bytes] = ..., msg: _Optional[bytes] = ...) -> None: ...

class NotifyList(_message.Message):
    __slots__ = ("notifies",)
    NOTIFIES_FIELD_NUMBER: _ClassVar[int]
    notifies: _containers.RepeatedCompositeFieldContainer[Notify]
    def __init__(self, notifies: _Optional[_Iterable[_Union[Notify, _Mapping]]] = ...) -> None: ...
