"""The size of a push's parts when the program does not choose one: one wire chunk when every ps is
on loopback (a part's request costs more than moving its bytes there), 256 KiB between hosts (the
upload of one part overlaps the download of the one before). Every task decides alike."""

import argparse

import numpy as np
import pytest

import shoal
from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.train.part_size import LINK_PART_BYTES, LOOPBACK_PART_BYTES, PartSize, part_bytes_for
from shoal.wire import CHUNK_BYTES, JobSecret

MiB = 1 << 20


@pytest.mark.parametrize("addresses", [["127.0.0.1:2222"], ["localhost:2222", "127.0.0.2:2223"], ["[::1]:2222"]])
def test_auto_part_is_one_wire_chunk_when_every_ps_is_on_loopback(addresses):
    assert part_bytes_for(PartSize.AUTO, addresses) == LOOPBACK_PART_BYTES == CHUNK_BYTES


@pytest.mark.parametrize("addresses", [["10.0.0.5:2222"], ["127.0.0.1:2222", "10.0.0.5:2222"], ["ps0.example:2222"]])
def test_auto_part_is_the_link_size_when_any_ps_is_not_on_loopback(addresses):
    assert part_bytes_for(PartSize.AUTO, addresses) == LINK_PART_BYTES == 256 << 10


@pytest.mark.parametrize("requested", [64, 256 << 10, None])
def test_a_chosen_part_size_is_kept_whatever_the_addresses(requested):
    assert part_bytes_for(requested, ["127.0.0.1:2222"]) == requested
    assert part_bytes_for(requested, ["10.0.0.5:2222"]) == requested


def session(ps_host: str, **kw) -> shoal.TrainingSession:
    spec = ClusterSpec.from_dict({"ps": [f"{ps_host}:2222"], "worker": ["127.0.0.1:2223"]})
    return shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 0)), {"w": np.zeros(4 * MiB, np.float32)},
                                 shoal.SGD(0.1), secret=JobSecret(b"s", "test"), **kw)


def test_session_on_loopback_pushes_a_16_mib_variable_in_4_parts_by_default():
    placement = session("127.0.0.1").placement  # the constructor does no I/O
    assert [s.nbytes for s in placement.shards] == [4 * MiB] * 4
    assert len(placement.push_parts(LOOPBACK_PART_BYTES)) == 4


def test_session_with_a_remote_ps_pushes_a_16_mib_variable_in_64_parts_by_default():
    assert len(session("10.0.0.5").placement.shards) == 64


def test_session_keeps_a_chosen_part_size_on_loopback():
    assert len(session("127.0.0.1", push_part_bytes=256 << 10).placement.shards) == 64
    assert len(session("127.0.0.1", push_part_bytes=None).placement.shards) == 1


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    shoal.add_training_flags(parser, {})
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv, want", [((), PartSize.AUTO), (("--push_part_bytes", "0"), None),
                                        (("--push_part_bytes", "65536"), 65536)])
def test_push_part_bytes_flag_reaches_the_session_as_auto_none_or_bytes(argv, want):
    assert shoal.session_options(parse(*argv))["push_part_bytes"] == want
