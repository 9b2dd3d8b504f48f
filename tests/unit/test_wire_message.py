import msgpack
import numpy as np
import pytest

from shoal.wire import ProtocolError, decode, encode
from shoal.wire.message import CHUNK_BYTES, PROTOCOL_VERSION


def roundtrip(header, tensors):
    frames = encode(header, tensors)
    return decode([bytes(f) for f in frames])


def test_tensors_roundtrip_exactly_for_every_dtype():
    tensors = {dt: (np.arange(24) % 7).astype(dt).reshape(2, 3, 4) for dt in
               ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool")}
    tensors["scalar"] = np.float64(2.5) * np.ones(())
    message = roundtrip({"op": "x", "rid": 1}, tensors)
    assert message.header["op"] == "x" and message.rid == 1
    for name, array in tensors.items():
        assert message.tensors[name].dtype == array.dtype
        assert message.tensors[name].shape == array.shape  # 0-d stays 0-d
        np.testing.assert_array_equal(message.tensors[name], array)


def test_large_tensor_is_chunked_and_reassembled():
    big = np.random.default_rng(0).random(CHUNK_BYTES // 8 * 2 + 5)  # just over two chunks
    frames = encode({"rid": 2}, {"big": big})
    assert len(frames) == 1 + 3
    np.testing.assert_array_equal(decode([bytes(f) for f in frames]).tensors["big"], big)


def test_encode_refuses_object_arrays_naming_the_tensor():
    with pytest.raises(ProtocolError, match="'bad' has dtype object"):
        encode({"rid": 1}, {"bad": np.array([object()])})


@pytest.mark.parametrize("header, match", [
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [2], 1]]}, "1 tensor frames but 0 arrived"),
    ({"v": 1, "rid": 1, "t": []}, "version 1 is not supported"),
    ({"v": PROTOCOL_VERSION, "rid": -1, "t": []}, "'rid' must be a non-negative int"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "complex64", [2], 1]]}, "unknown dtype"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [-2], 1]]}, "bad shape"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [2], 0]]}, "bad chunk count"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [2], 1], ["x", "float32", [2], 1]]}, "duplicate tensor name"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": "nope"}, "'t' must be a list"),
    ({"v": PROTOCOL_VERSION, "rid": True, "t": []}, "'rid' must be a non-negative int"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [True], 1]]}, "bad shape"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [2], True]]}, "bad chunk count"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", ["float32"], [2], 1]]}, "unknown dtype"),
    ({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", {"a": 1}, [2], 1]]}, "unknown dtype"),
], ids=["frames", "version", "rid", "dtype", "shape", "chunks", "duplicate", "t", "bool-rid", "bool-dim",
        "bool-chunks", "list-dtype", "map-dtype"])
def test_decode_rejects_bad_headers(header, match):
    with pytest.raises(ProtocolError, match=match):
        decode([msgpack.packb(header)])


def test_decode_rejects_wrong_byte_count():
    frames = [msgpack.packb({"v": PROTOCOL_VERSION, "rid": 1, "t": [["x", "float32", [4], 1]]}), b"\0" * 15]
    with pytest.raises(ProtocolError, match="needs 16 bytes, got 15"):
        decode(frames)


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\xa5hello"])
def test_decode_rejects_garbage(raw):
    with pytest.raises(ProtocolError):
        decode([raw])


def test_decode_reads_zmq_frames_and_buffers_alike():
    import zmq
    value = np.arange(12, dtype=np.int32).reshape(3, 4)
    frames = encode({"rid": 5}, {"v": value})
    for kind in (bytes, memoryview, lambda f: zmq.Frame(bytes(f))):
        message = decode([frames[0] if kind is memoryview else kind(frames[0]), *(kind(bytes(f)) for f in frames[1:])])
        np.testing.assert_array_equal(message.tensors["v"], value)
        dest = np.zeros_like(value)
        decoded = decode([bytes(frames[0]), *(kind(bytes(f)) for f in frames[1:])], into=lambda *a: dest)
        assert decoded.tensors["v"] is dest
        np.testing.assert_array_equal(dest, value)


def test_decode_into_a_destination_writes_the_bytes_there():
    big = np.random.default_rng(1).random(CHUNK_BYTES // 8 + 3)  # two chunks
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    dest = {"big": np.zeros_like(big), "small": np.zeros_like(small)}
    frames = [bytes(f) for f in encode({"rid": 3}, {"big": big, "small": small})]
    message = decode(frames, into=lambda header, name, dtype, shape: dest[name])
    for name, want in (("big", big), ("small", small)):
        assert message.tensors[name] is dest[name]
        np.testing.assert_array_equal(dest[name], want)


def _read_only():
    array = np.zeros(4)
    array.setflags(write=False)
    return array


@pytest.mark.parametrize("make_wrong", [lambda: np.zeros(5), lambda: np.zeros(4, np.float32),
                                        lambda: np.zeros(8)[::2], _read_only],
                         ids=["shape", "dtype", "strided", "readonly"])
def test_decode_ignores_a_destination_that_does_not_fit(make_wrong):
    value = np.arange(4, dtype=np.float64)
    wrong = make_wrong()
    message = decode([bytes(f) for f in encode({"rid": 4}, {"v": value})], into=lambda *a: wrong)
    assert message.tensors["v"] is not wrong
    np.testing.assert_array_equal(message.tensors["v"], value)
    assert not wrong.any()


def test_encode_refuses_a_header_over_the_limit():
    from shoal.wire.message import MAX_HEADER_BYTES
    with pytest.raises(ProtocolError, match=f"exceeds the {MAX_HEADER_BYTES}-byte limit"):
        encode({"rid": 1, "names": ["x" * 100] * (MAX_HEADER_BYTES // 100)})
