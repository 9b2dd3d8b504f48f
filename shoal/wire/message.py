"""Wire format v2: one msgpack header frame, then the raw bytes of each tensor.

A message is a zmq multipart message:

    frame 0      msgpack map (the header), at most MAX_HEADER_BYTES
    frames 1..   for each tensor listed in header["t"], in order, `nchunks` frames whose bytes,
                 concatenated, are the tensor in C order, little-endian

Header keys every message has:

    "v"    int    protocol version, must be PROTOCOL_VERSION
    "rid"  int    request id, chosen by the client, echoed in the reply
    "t"    list   tensor descriptors [name: str, dtype: str, shape: [int...], nchunks: int]

and, when the tensors are in a shared-memory area instead of frames (shoal/wire/shared_area.py):

    "m"    list   [offset, nbytes] of the block of the sender's area that holds them, each
                  tensor ALIGN-aligned, in order; every descriptor's nchunks is then 0

plus "op" (str) in a request, or "ok" (bool) and, when not ok, "error" (str) in a reply.
Other keys belong to the op and are validated by whoever handles it. Nothing is ever
unpickled; see docs/wire-protocol.md for the full description and the threat model.

Large tensors are split into CHUNK_BYTES frames: zmq moves a 128 MiB single frame at about
half the speed of a raw socket here, and chunks near 1-4 MiB keep it near the raw speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import msgpack
import numpy as np

from shoal.wire.errors import ProtocolError
from shoal.wire.shared_area import ALIGN, BLOCK_KEY

PROTOCOL_VERSION = 2
CHUNK_BYTES = 4 << 20
MAX_HEADER_BYTES = 1 << 20
MAX_NAME_CHARS = 512
MAX_RANK = 32
MAX_CHUNKS = 1 << 16
_MAX_DIM = 1 << 40

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool")
}
_DTYPE_NAMES = {dt: name for name, dt in DTYPES.items()}
# the dtypes whose native byte order is already little-endian (all of them on x86 and ARM)
_NATIVE_NAMES = {np.dtype(name): name for name, dt in DTYPES.items() if np.dtype(name) == dt}


@dataclass(frozen=True)
class Message:
    """A decoded message: its header (validated envelope) and its tensors by name.

    Tensors that arrived in one frame are read-only views of that frame (zero copy).
    """

    header: dict[str, Any]
    tensors: dict[str, np.ndarray]

    @property
    def rid(self) -> int:
        return self.header["rid"]


def encode(header: dict[str, Any], tensors: Mapping[str, np.ndarray] | None = None,
           block: tuple[int, memoryview] | None = None) -> list:
    """Frames for `header` + `tensors`: bytes for the header, memoryviews (no copy) for tensors.

    The caller must not modify the tensors until zmq has sent them (see RpcServer.reply's
    `track`). With `block` ((offset in the area, its writable bytes), at least
    shared_area.packed_nbytes(tensors) of them) the tensors are copied into it instead and the
    message is the header alone. Raises ProtocolError for a dtype the format does not carry, or
    a header over MAX_HEADER_BYTES.
    """
    frames: list = [b""]
    descriptors = []
    pos = 0
    for name, array in (tensors or {}).items():
        dtype = _NATIVE_NAMES.get(array.dtype)  # (a dict hit for the usual dtypes; newbyteorder costs more)
        if dtype is None and array.dtype.byteorder in "<=|":
            dtype = _DTYPE_NAMES.get(array.dtype.newbyteorder("<"))
        if dtype is None:
            raise ProtocolError(f"tensor {name!r} has dtype {array.dtype}, which Shoal does not send; "
                                f"convert it to one of {', '.join(DTYPES)}")
        if not array.flags.c_contiguous:
            array = np.require(array, requirements="C")  # (np.ascontiguousarray makes 0-d arrays 1-d)
        nbytes = array.nbytes
        if block is not None:  # into the shared block, ALIGN-aligned
            np.copyto(np.frombuffer(block[1], array.dtype, array.size, pos).reshape(array.shape), array)
            pos += -(-nbytes // ALIGN) * ALIGN
            descriptors.append([name, dtype, list(array.shape), 0])
            continue
        view = memoryview(array).cast("B") if array.ndim else memoryview(array.reshape(1)).cast("B")
        if nbytes <= CHUNK_BYTES:  # the usual tensor: one frame
            nchunks = 1
            frames.append(view)
        else:
            nchunks = -(-nbytes // CHUNK_BYTES)
            for i in range(nchunks):
                frames.append(view[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES])
        descriptors.append([name, dtype, list(array.shape), nchunks])
    header = dict(header, v=PROTOCOL_VERSION, t=descriptors)
    if block is not None:
        header[BLOCK_KEY] = [block[0], block[1].nbytes]
    frames[0] = msgpack.packb(header, use_bin_type=True)
    if len(frames[0]) > MAX_HEADER_BYTES:  # the peer would refuse it, or zmq drop the connection
        raise ProtocolError(f"header of {len(frames[0])} bytes exceeds the {MAX_HEADER_BYTES}-byte limit; "
                            "send fewer names per request or split the request")
    return frames


Into = Callable[[dict, str, np.dtype, tuple], "np.ndarray | None"]
SharedView = Callable[[int, int], memoryview]
"""view(offset, nbytes): bytes of the area a message's block is in; raises ValueError outside it."""


def decode(frames: Sequence, into: Into | None = None, shared: SharedView | None = None,
           borrow: "bool | Callable[[dict], bool]" = False) -> Message:
    """Validate and decode frames (bytes or zmq.Frame). Raises ProtocolError on anything odd.

    `into(header, name, dtype, shape)` may return a writable C-contiguous array of exactly that
    dtype and shape: the tensor's bytes are then copied straight into it (a worker's own
    parameters, a ps's gradient buffer) instead of into a fresh array, and it is the decoded
    tensor. Called only after the sizes were checked.

    Tensors in a shared-memory block (header "m") are read through `shared` (none: a
    ProtocolError). They are copied (into `into`'s arrays or fresh ones), or with `borrow` (or
    `borrow(header)` true) are read-only views of the area, valid only until the block is
    handed back.
    """
    if not frames:
        raise ProtocolError("empty message")
    return decode_body(decode_header(frame_bytes(frames[0])), frames, into, shared, borrow)


def decode_body(header: dict[str, Any], frames: Sequence, into: Into | None = None, shared: SharedView | None = None,
                borrow: "bool | Callable[[dict], bool]" = False) -> Message:
    """`decode` of a message whose header (`frames[0]`) the caller already decoded with
    `decode_header` (to read a field that says how to decode the rest)."""
    descriptors = header["t"]
    if BLOCK_KEY in header:
        return _decode_shared(header, len(frames), into, shared, borrow)
    if not descriptors and len(frames) == 1:  # a header-only message
        return Message(header, {})
    expected = 1 + sum(d[3] for d in descriptors)
    if len(frames) != expected:
        raise ProtocolError(f"header lists {expected - 1} tensor frames but {len(frames) - 1} arrived")
    tensors: dict[str, np.ndarray] = {}
    pos = 1
    for name, dtype_name, shape, nchunks in descriptors:
        dtype = DTYPES[dtype_name]
        nbytes = math.prod(shape) * dtype.itemsize
        if nchunks == 1:
            parts = [_as_buffer(frames[pos])]
            got = parts[0].nbytes
        else:
            parts = [_as_buffer(f) for f in frames[pos:pos + nchunks]]
            got = sum(p.nbytes for p in parts)
        pos += nchunks
        if got != nbytes:
            raise ProtocolError(f"tensor {name!r} {dtype_name}{shape} needs {nbytes} bytes, got {got}")
        dest = into(header, name, dtype, tuple(shape)) if into is not None else None
        if dest is not None and _fits(dest, dtype, shape):
            if nchunks == 1:
                np.copyto(dest, np.frombuffer(parts[0], dtype=dtype).reshape(dest.shape))
            else:
                flat = dest.reshape(-1).view(np.uint8)
                offset = 0
                for p in parts:
                    flat[offset:offset + p.nbytes] = np.frombuffer(p, dtype=np.uint8)
                    offset += p.nbytes
            tensors[name] = dest
            continue
        if nchunks == 1:
            array = np.frombuffer(parts[0], dtype=dtype)
        else:
            array = np.empty(nbytes, dtype=np.uint8)
            offset = 0
            for p in parts:
                array[offset:offset + p.nbytes] = np.frombuffer(p, dtype=np.uint8)
                offset += p.nbytes
            array = array.view(dtype)
        tensors[name] = array.reshape(shape)
    return Message(header, tensors)


def _decode_shared(header: dict, nframes: int, into: Into | None, shared: SharedView | None,
                   borrow) -> Message:
    block = header[BLOCK_KEY]
    if callable(borrow):
        borrow = borrow(header)
    if type(block) is not list or len(block) != 2 or any(type(x) is not int or x < 0 for x in block):
        raise ProtocolError(f"header field {BLOCK_KEY!r} must be [offset, nbytes], got {block!r:.80}")
    if nframes != 1:
        raise ProtocolError(f"a message whose tensors are in shared memory has {nframes - 1} tensor frames too")
    if shared is None:
        raise ProtocolError("the message's tensors are in a shared-memory area this side has not attached")
    try:
        area = shared(block[0], block[1])
    except ValueError as e:
        raise ProtocolError(str(e)) from e
    tensors: dict[str, np.ndarray] = {}
    pos = 0
    for name, dtype_name, shape, _ in header["t"]:  # (every nchunks is 0: decode_header checked)
        dtype = DTYPES[dtype_name]
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if pos + nbytes > block[1]:
            raise ProtocolError(f"tensors of {pos + nbytes}+ bytes do not fit their {block[1]}-byte block")
        view = np.frombuffer(area, dtype, count, pos).reshape(shape)
        pos += -(-nbytes // ALIGN) * ALIGN
        dest = into(header, name, dtype, tuple(shape)) if into is not None and not borrow else None
        if dest is not None and _fits(dest, dtype, shape):
            np.copyto(dest, view)
            tensors[name] = dest
        elif borrow:
            view.flags.writeable = False  # the client's memory: the handler reads it only
            tensors[name] = view
        else:
            tensors[name] = view.copy()
    return Message(header, tensors)


def decode_header(raw: bytes) -> dict[str, Any]:
    """Unpack and validate the envelope of a header frame (not the op's own fields)."""
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types for garbage input
        raise ProtocolError(f"header is not valid msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r} is not supported (this is v{PROTOCOL_VERSION}); "
                            "run the same Shoal version on every task")
    rid = header.get("rid")
    if type(rid) is not int or rid < 0:  # (msgpack gives exact ints; `type` also turns bools away)
        raise ProtocolError(f"header field 'rid' must be a non-negative int, got {rid!r}")
    _validate_descriptors(header.get("t"), BLOCK_KEY in header)
    return header


def _validate_descriptors(descriptors: Any, shared: bool) -> None:
    # Every message passes here: plain loops and exact type checks (msgpack gives exact ints,
    # and `type(x) is int` turns bools away) keep it cheap.
    if type(descriptors) is not list:
        raise ProtocolError(f"header field 't' must be a list, got {type(descriptors).__name__}")
    seen = set()
    for d in descriptors:
        if type(d) is not list or len(d) != 4:
            raise ProtocolError(f"tensor descriptor must be [name, dtype, shape, nchunks], got {d!r:.200}")
        name, dtype, shape, nchunks = d
        if type(name) is not str or not 0 < len(name) <= MAX_NAME_CHARS or name in seen:
            raise ProtocolError(f"bad or duplicate tensor name {name!r:.200}")
        seen.add(name)
        if type(dtype) is not str or dtype not in DTYPES:
            raise ProtocolError(f"tensor {name!r} has unknown dtype {dtype!r:.50}")
        if type(shape) is not list or len(shape) > MAX_RANK:
            raise ProtocolError(f"tensor {name!r} has bad shape {shape!r:.200}")
        for size in shape:
            if type(size) is not int or not 0 <= size < _MAX_DIM:
                raise ProtocolError(f"tensor {name!r} has bad shape {shape!r:.200}")
        if type(nchunks) is not int or not (nchunks == 0 if shared else 1 <= nchunks <= MAX_CHUNKS):
            raise ProtocolError(f"tensor {name!r} has bad chunk count {nchunks!r:.50}"
                                + (" (its message's tensors are in a shared block: 0)" if shared else ""))


def _fits(dest: np.ndarray, dtype: np.dtype, shape: list[int]) -> bool:
    return (dest.dtype == dtype and dest.shape == tuple(shape) and dest.flags.c_contiguous
            and dest.flags.writeable)


def frame_bytes(frame) -> bytes:
    """The bytes of a frame (bytes, or a zmq.Frame)."""
    return frame if isinstance(frame, bytes) else frame.bytes


def _as_buffer(frame) -> memoryview:
    if type(frame) is memoryview:
        return frame
    return memoryview(frame) if isinstance(frame, bytes) else frame.buffer
