from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ClockExchangeRequest(_message.Message):
    __slots__ = ("client_send_unix_ns",)
    CLIENT_SEND_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    client_send_unix_ns: int
    def __init__(self, client_send_unix_ns: _Optional[int] = ...) -> None: ...

class ClockExchangeResponse(_message.Message):
    __slots__ = ("client_send_unix_ns", "server_receive_unix_ns", "server_send_unix_ns")
    CLIENT_SEND_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SERVER_RECEIVE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SERVER_SEND_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    client_send_unix_ns: int
    server_receive_unix_ns: int
    server_send_unix_ns: int
    def __init__(self, client_send_unix_ns: _Optional[int] = ..., server_receive_unix_ns: _Optional[int] = ..., server_send_unix_ns: _Optional[int] = ...) -> None: ...
