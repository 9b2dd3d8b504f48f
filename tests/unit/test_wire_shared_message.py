"""Messages whose tensors are in a shared-memory block: encode writes them there and sends only
the header; decode reads them back, copied or borrowed, and refuses a header that points outside
the area or mixes frames and a block. (The areas themselves, between processes:
tests/cluster/test_wire_shared_memory.py.)"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from shoal.wire import ProtocolError, decode, encode
from shoal.wire.shared_area import BLOCK_KEY, PAGE, AreaState, SharedArea, packed_nbytes


class Area:
    """A byte array standing in for a shared area, with the bounds check the real ones make."""

    def __init__(self, nbytes: int = 1 << 20):
        self.data = bytearray(nbytes)

    def view(self, offset: int, nbytes: int) -> memoryview:
        if not (PAGE <= offset and offset + nbytes <= len(self.data)):
            raise ValueError(f"bytes {offset}..{offset + nbytes} are outside the area")
        return memoryview(self.data)[offset:offset + nbytes]


def tensors() -> dict[str, np.ndarray]:
    return {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1.5, -2.0]),
            "n": np.array(7, dtype=np.int64)}


def shared_message(area: Area, offset: int = PAGE):
    sent = tensors()
    block = area.view(offset, packed_nbytes(sent))
    return sent, encode({"rid": 3, "op": "push"}, sent, (offset, block))


def test_tensors_in_a_block_are_sent_as_the_header_alone_and_decode_to_copies():
    area = Area()
    sent, frames = shared_message(area)
    assert len(frames) == 1, "the tensors must not travel as frames"
    message = decode(frames, shared=area.view)
    assert message.header[BLOCK_KEY] == [PAGE, packed_nbytes(sent)]
    for name, want in sent.items():
        np.testing.assert_array_equal(message.tensors[name], want)
        assert message.tensors[name].dtype == want.dtype
    area.data[PAGE:PAGE + 48] = bytes(48)  # the block is reused: the decoded copies keep their values
    np.testing.assert_array_equal(message.tensors["w"], sent["w"])


def test_borrowed_tensors_are_read_only_views_of_the_block():
    area = Area()
    sent, frames = shared_message(area)
    message = decode(frames, shared=area.view, borrow=lambda header: header["op"] == "push")
    assert not message.tensors["w"].flags.writeable
    area.data[PAGE:PAGE + 4] = np.float32(99.0).tobytes()
    assert message.tensors["w"][0, 0] == 99.0, "a borrowed tensor must read the block itself"


def test_decoded_into_the_callers_arrays():
    area = Area()
    sent, frames = shared_message(area)
    dest = np.zeros((3, 4), np.float32)
    message = decode(frames, lambda header, name, dtype, shape: dest if name == "w" else None, area.view)
    assert message.tensors["w"] is dest
    np.testing.assert_array_equal(dest, sent["w"])


@pytest.mark.parametrize("block", [[0, 256], [PAGE, 1 << 30], [(1 << 20) - 8, 64], "x", [PAGE], [-1, 64]])
def test_a_block_outside_the_area_or_malformed_is_refused(block):
    area = Area()
    _, frames = shared_message(area)
    header = msgpack.unpackb(frames[0])
    header[BLOCK_KEY] = block
    with pytest.raises(ProtocolError):
        decode([msgpack.packb(header, use_bin_type=True)], shared=area.view)


def test_tensors_bigger_than_their_block_are_refused():
    area = Area()
    _, frames = shared_message(area)
    header = msgpack.unpackb(frames[0])
    header[BLOCK_KEY] = [PAGE, 64]  # "w" alone needs 48 bytes, then "b" does not fit
    with pytest.raises(ProtocolError, match="do not fit"):
        decode([msgpack.packb(header, use_bin_type=True)], shared=area.view)


def test_a_block_with_frames_too_or_no_attached_area_is_refused():
    area = Area()
    _, frames = shared_message(area)
    with pytest.raises(ProtocolError, match="tensor frames too"):
        decode([*frames, b"\0" * 48], shared=area.view)
    with pytest.raises(ProtocolError, match="has not attached"):
        decode(frames)


def test_a_tensor_without_frames_outside_a_block_is_refused():
    header = {"v": 2, "rid": 1, "op": "push", "t": [["x", "float32", [0], 0]]}
    with pytest.raises(ProtocolError, match="bad chunk count"):
        decode([msgpack.packb(header, use_bin_type=True)])


def test_blocks_of_requests_in_flight_do_not_overlap_and_are_reused_once_freed():
    area = SharedArea(nbytes=16 * PAGE)
    area.open()
    try:
        assert area.state is AreaState.OFFERED
        a = area.allocate(1, 3 * PAGE)
        b = area.allocate(2, 1)
        c = area.allocate(3, 5 * PAGE)
        spans = sorted((x.offset, x.offset + x.nbytes) for x in (a, b, c))
        assert spans[0][0] >= PAGE and all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
        assert area.allocate(4, 8 * PAGE) is None, "15 pages minus 9 in use cannot hold 8"
        area.free(1)
        d = area.allocate(5, 2 * PAGE)
        assert d.offset == a.offset, "the first block that fits is the freed one"
    finally:
        area.close()
