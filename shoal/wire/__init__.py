"""Transport: authenticated request/reply over zmq with a versioned header + raw tensor frames.

Moves bytes and named arrays; knows nothing about variables or training.
"""

from shoal.wire.client import RpcClient, wait_all
from shoal.wire.errors import (AuthRejectedError, BindError, PeerLostError, PeerTimeoutError, ProtocolError,
                               RemoteError, SecretError, WireError)
from shoal.wire.message import CHUNK_BYTES, PROTOCOL_VERSION, Message, decode, encode
from shoal.wire.limits import ConnectionLimits
from shoal.wire.secret import JobSecret
from shoal.wire.security import Security
from shoal.wire.server import Request, RpcServer

__all__ = ["AuthRejectedError", "BindError", "CHUNK_BYTES", "ConnectionLimits", "JobSecret", "Message",
           "PROTOCOL_VERSION", "PeerLostError", "PeerTimeoutError", "ProtocolError", "RemoteError", "Request",
           "RpcClient", "RpcServer", "Security", "SecretError", "WireError", "decode", "encode", "wait_all"]
