from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("node_id", "protocol_version", "run")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    protocol_version: int
    run: str
    def __init__(self, node_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., run: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("node_id", "protocol_version", "run")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    protocol_version: int
    run: str
    def __init__(self, node_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., run: _Optional[str] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("name", "codec", "dtype", "shape", "nbytes", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    codec: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    params: _containers.ScalarMap[str, float]
    def __init__(self, name: _Optional[str] = ..., codec: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., params: _Optional[_Mapping[str, float]] = ...) -> None: ...

class MessageHeader(_message.Message):
    __slots__ = ("run", "round", "phase", "sender", "receiver", "tensors", "scalars", "total_bytes")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    run: str
    round: int
    phase: int
    sender: str
    receiver: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorHeader]
    scalars: _containers.ScalarMap[str, float]
    total_bytes: int
    def __init__(self, run: _Optional[str] = ..., round: _Optional[int] = ..., phase: _Optional[int] = ..., sender: _Optional[str] = ..., receiver: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorHeader, _Mapping]]] = ..., scalars: _Optional[_Mapping[str, float]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: MessageHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[MessageHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("received_bytes",)
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    def __init__(self, received_bytes: _Optional[int] = ...) -> None: ...
