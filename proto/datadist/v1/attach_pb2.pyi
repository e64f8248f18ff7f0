from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttachRequest(_message.Message):
    __slots__ = ("request_id", "hello", "import_memory", "export_pool", "release_memory")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    IMPORT_MEMORY_FIELD_NUMBER: _ClassVar[int]
    EXPORT_POOL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    hello: AttachHello
    import_memory: ImportMemory
    export_pool: ExportPool
    release_memory: ReleaseMemory
    def __init__(self, request_id: _Optional[int] = ..., hello: _Optional[_Union[AttachHello, _Mapping]] = ..., import_memory: _Optional[_Union[ImportMemory, _Mapping]] = ..., export_pool: _Optional[_Union[ExportPool, _Mapping]] = ..., release_memory: _Optional[_Union[ReleaseMemory, _Mapping]] = ...) -> None: ...

class AttachHello(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class ImportMemory(_message.Message):
    __slots__ = ("pieces", "offset", "length", "device_key", "device_id")
    PIECES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    pieces: _containers.RepeatedCompositeFieldContainer[FdPiece]
    offset: int
    length: int
    device_key: str
    device_id: int
    def __init__(self, pieces: _Optional[_Iterable[_Union[FdPiece, _Mapping]]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., device_key: _Optional[str] = ..., device_id: _Optional[int] = ...) -> None: ...

class FdPiece(_message.Message):
    __slots__ = ("file_offset", "length")
    FILE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    file_offset: int
    length: int
    def __init__(self, file_offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ExportPool(_message.Message):
    __slots__ = ("engine_id", "pool", "bare_tgid")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    BARE_TGID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    pool: str
    bare_tgid: int
    def __init__(self, engine_id: _Optional[int] = ..., pool: _Optional[str] = ..., bare_tgid: _Optional[int] = ...) -> None: ...

class ReleaseMemory(_message.Message):
    __slots__ = ("memory_id",)
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    memory_id: int
    def __init__(self, memory_id: _Optional[int] = ...) -> None: ...

class AttachReply(_message.Message):
    __slots__ = ("request_id", "status", "message", "welcome", "imported", "pool")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: int
    message: str
    welcome: Welcome
    imported: MemoryImported
    pool: PoolExported
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[int] = ..., message: _Optional[str] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., imported: _Optional[_Union[MemoryImported, _Mapping]] = ..., pool: _Optional[_Union[PoolExported, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("capability", "uid", "gid", "pid", "daemon_version", "protocol_version", "memory_backend", "device_id", "bare_tgid")
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DAEMON_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    BARE_TGID_FIELD_NUMBER: _ClassVar[int]
    capability: bytes
    uid: int
    gid: int
    pid: int
    daemon_version: str
    protocol_version: int
    memory_backend: str
    device_id: int
    bare_tgid: int
    def __init__(self, capability: _Optional[bytes] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., pid: _Optional[int] = ..., daemon_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., memory_backend: _Optional[str] = ..., device_id: _Optional[int] = ..., bare_tgid: _Optional[int] = ...) -> None: ...

class MemoryImported(_message.Message):
    __slots__ = ("memory_id", "mapped")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    MAPPED_FIELD_NUMBER: _ClassVar[int]
    memory_id: int
    mapped: bool
    def __init__(self, memory_id: _Optional[int] = ..., mapped: _Optional[bool] = ...) -> None: ...

class PoolExported(_message.Message):
    __slots__ = ("size", "device_key", "device_id")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    size: int
    device_key: str
    device_id: int
    def __init__(self, size: _Optional[int] = ..., device_key: _Optional[str] = ..., device_id: _Optional[int] = ...) -> None: ...
