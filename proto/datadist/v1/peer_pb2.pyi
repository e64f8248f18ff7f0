from datadist.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_BLOCKS: _ClassVar[ReadMode]
    READ_SLOT: _ClassVar[ReadMode]
READ_BLOCKS: ReadMode
READ_SLOT: ReadMode

class OwnerCall(_message.Message):
    __slots__ = ("command_id", "open_write", "commit_write", "read", "release", "unlink", "ping", "grant_read", "done_read")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_WRITE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_WRITE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    UNLINK_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    GRANT_READ_FIELD_NUMBER: _ClassVar[int]
    DONE_READ_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    open_write: WriteRequest
    commit_write: CommitRequest
    read: ReadRequest
    release: ReleaseRequest
    unlink: Unlink
    ping: Ping
    grant_read: ReadRequest
    done_read: DoneRead
    def __init__(self, command_id: _Optional[int] = ..., open_write: _Optional[_Union[WriteRequest, _Mapping]] = ..., commit_write: _Optional[_Union[CommitRequest, _Mapping]] = ..., read: _Optional[_Union[ReadRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., unlink: _Optional[_Union[Unlink, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., grant_read: _Optional[_Union[ReadRequest, _Mapping]] = ..., done_read: _Optional[_Union[DoneRead, _Mapping]] = ...) -> None: ...

class OwnerReply(_message.Message):
    __slots__ = ("command_id", "status", "message", "transfer_id", "bytes", "release_needed", "more_transfer_ids", "grant")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_NEEDED_FIELD_NUMBER: _ClassVar[int]
    MORE_TRANSFER_IDS_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    status: int
    message: str
    transfer_id: int
    bytes: int
    release_needed: bool
    more_transfer_ids: _containers.RepeatedScalarFieldContainer[int]
    grant: bytes
    def __init__(self, command_id: _Optional[int] = ..., status: _Optional[int] = ..., message: _Optional[str] = ..., transfer_id: _Optional[int] = ..., bytes: _Optional[int] = ..., release_needed: _Optional[bool] = ..., more_transfer_ids: _Optional[_Iterable[int]] = ..., grant: _Optional[bytes] = ...) -> None: ...

class DoneRead(_message.Message):
    __slots__ = ("grant_id", "consume")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FIELD_NUMBER: _ClassVar[int]
    grant_id: int
    consume: bool
    def __init__(self, grant_id: _Optional[int] = ..., consume: _Optional[bool] = ...) -> None: ...

class ChallengeRequest(_message.Message):
    __slots__ = ("protocol_version", "client_cluster_id", "server_cluster_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    client_cluster_id: int
    server_cluster_id: int
    def __init__(self, protocol_version: _Optional[int] = ..., client_cluster_id: _Optional[int] = ..., server_cluster_id: _Optional[int] = ...) -> None: ...

class ChallengeResponse(_message.Message):
    __slots__ = ("protocol_version", "challenge")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    challenge: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., challenge: _Optional[bytes] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("protocol_version", "client_cluster_id", "server_cluster_id", "challenge", "timestamp_ms", "mac", "client_version")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    client_cluster_id: int
    server_cluster_id: int
    challenge: bytes
    timestamp_ms: int
    mac: bytes
    client_version: str
    def __init__(self, protocol_version: _Optional[int] = ..., client_cluster_id: _Optional[int] = ..., server_cluster_id: _Optional[int] = ..., challenge: _Optional[bytes] = ..., timestamp_ms: _Optional[int] = ..., mac: _Optional[bytes] = ..., client_version: _Optional[str] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("protocol_version", "server_cluster_id", "session", "data_endpoint", "streams", "mac", "server_version", "caches")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    server_cluster_id: int
    session: bytes
    data_endpoint: str
    streams: int
    mac: bytes
    server_version: str
    caches: _containers.RepeatedCompositeFieldContainer[CacheLayout]
    def __init__(self, protocol_version: _Optional[int] = ..., server_cluster_id: _Optional[int] = ..., session: _Optional[bytes] = ..., data_endpoint: _Optional[str] = ..., streams: _Optional[int] = ..., mac: _Optional[bytes] = ..., server_version: _Optional[str] = ..., caches: _Optional[_Iterable[_Union[CacheLayout, _Mapping]]] = ...) -> None: ...

class CacheLayout(_message.Message):
    __slots__ = ("cache_id", "desc", "is_blocks")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    desc: _common_pb2.CacheDesc
    is_blocks: bool
    def __init__(self, cache_id: _Optional[int] = ..., desc: _Optional[_Union[_common_pb2.CacheDesc, _Mapping]] = ..., is_blocks: _Optional[bool] = ...) -> None: ...

class Unlink(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Ping(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("transfer_id", "key", "mode", "blocks", "size", "offset", "tensor_start", "tensor_count", "expected_bytes", "timeout_ms")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TENSOR_START_FIELD_NUMBER: _ClassVar[int]
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: int
    key: _common_pb2.AnyKey
    mode: ReadMode
    blocks: _containers.RepeatedScalarFieldContainer[int]
    size: int
    offset: int
    tensor_start: int
    tensor_count: int
    expected_bytes: int
    timeout_ms: int
    def __init__(self, transfer_id: _Optional[int] = ..., key: _Optional[_Union[_common_pb2.AnyKey, _Mapping]] = ..., mode: _Optional[_Union[ReadMode, str]] = ..., blocks: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., offset: _Optional[int] = ..., tensor_start: _Optional[int] = ..., tensor_count: _Optional[int] = ..., expected_bytes: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("key", "tensor_start", "tensor_count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TENSOR_START_FIELD_NUMBER: _ClassVar[int]
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.AnyKey
    tensor_start: int
    tensor_count: int
    def __init__(self, key: _Optional[_Union[_common_pb2.AnyKey, _Mapping]] = ..., tensor_start: _Optional[int] = ..., tensor_count: _Optional[int] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("key", "mode", "blocks", "size", "offset", "tensor_start", "tensor_count", "expected_bytes", "timeout_ms", "more", "hold_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TENSOR_START_FIELD_NUMBER: _ClassVar[int]
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.AnyKey
    mode: ReadMode
    blocks: _containers.RepeatedScalarFieldContainer[int]
    size: int
    offset: int
    tensor_start: int
    tensor_count: int
    expected_bytes: int
    timeout_ms: int
    more: _containers.RepeatedCompositeFieldContainer[WriteRequest]
    hold_ms: int
    def __init__(self, key: _Optional[_Union[_common_pb2.AnyKey, _Mapping]] = ..., mode: _Optional[_Union[ReadMode, str]] = ..., blocks: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., offset: _Optional[int] = ..., tensor_start: _Optional[int] = ..., tensor_count: _Optional[int] = ..., expected_bytes: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., more: _Optional[_Iterable[_Union[WriteRequest, _Mapping]]] = ..., hold_ms: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("transfer_id", "timeout_ms", "more_transfer_ids")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MORE_TRANSFER_IDS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: int
    timeout_ms: int
    more_transfer_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, transfer_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., more_transfer_ids: _Optional[_Iterable[int]] = ...) -> None: ...
