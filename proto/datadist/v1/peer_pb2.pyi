from datadist.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("protocol_version", "client_cluster_id", "server_cluster_id", "challenge", "timestamp_ms", "mac", "client_version", "daemon_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    client_cluster_id: int
    server_cluster_id: int
    challenge: bytes
    timestamp_ms: int
    mac: bytes
    client_version: str
    daemon_id: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., client_cluster_id: _Optional[int] = ..., server_cluster_id: _Optional[int] = ..., challenge: _Optional[bytes] = ..., timestamp_ms: _Optional[int] = ..., mac: _Optional[bytes] = ..., client_version: _Optional[str] = ..., daemon_id: _Optional[bytes] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("protocol_version", "server_cluster_id", "link_nonce", "data_endpoint", "streams", "mac", "server_version", "caches", "daemon_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LINK_NONCE_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    server_cluster_id: int
    link_nonce: bytes
    data_endpoint: str
    streams: int
    mac: bytes
    server_version: str
    caches: _containers.RepeatedCompositeFieldContainer[CacheLayout]
    daemon_id: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., server_cluster_id: _Optional[int] = ..., link_nonce: _Optional[bytes] = ..., data_endpoint: _Optional[str] = ..., streams: _Optional[int] = ..., mac: _Optional[bytes] = ..., server_version: _Optional[str] = ..., caches: _Optional[_Iterable[_Union[CacheLayout, _Mapping]]] = ..., daemon_id: _Optional[bytes] = ...) -> None: ...

class CacheLayout(_message.Message):
    __slots__ = ("cache_id", "desc", "is_blocks")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    desc: _common_pb2.CacheDesc
    is_blocks: bool
    def __init__(self, cache_id: _Optional[int] = ..., desc: _Optional[_Union[_common_pb2.CacheDesc, _Mapping]] = ..., is_blocks: _Optional[bool] = ...) -> None: ...
