"""A ps keeps the memory of large pushes between requests: a push that brings tens of MiB does
not make the kernel hand the ps fresh (zeroed) pages every time.

The ps runs with transparent huge pages off (prctl PR_SET_THP_DISABLE), so that every fresh page
is one minor fault and the count tells how much memory a push took from the kernel."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import shoal
from tests.cluster.ps_process import PS_ONLY, config_for, secret_of, wait_until_serving

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts faults in /proc (Linux)")

PS_WITHOUT_THP = ["-c", "import ctypes; ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)\n" + PS_ONLY[1]]  # PR_SET_THP_DISABLE
MiB = 1 << 20


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


def faults_per_push(make_cluster, nbytes: int, push_part_bytes: int | None, pushes: int = 4) -> float:
    cluster = make_cluster(1, 1)
    ps = cluster.start("ps", 0, PS_WITHOUT_THP)
    wait_until_serving(cluster)
    value = np.zeros(nbytes // 4, np.float32)
    grad = np.full_like(value, 0.5)
    session = shoal.TrainingSession(config_for(cluster, "worker", 0), {"w": value}, shoal.SGD(0.0),
                                    secret=secret_of(cluster), push_part_bytes=push_part_bytes,
                                    request_timeout_s=60)
    with session:
        for _ in range(2):  # the first pushes size the ps's buffers
            session.push({"w": grad})
        before = minor_faults(ps.proc.pid)
        for _ in range(pushes):
            session.push({"w": grad})
        after = minor_faults(ps.proc.pid)
    assert ps.wait(30) == 0, cluster.dump()
    return (after - before) / pushes


def test_ps_takes_no_fresh_pages_per_push_when_a_push_is_one_message(make_cluster):
    # 72 MiB: above glibc's default largest mmap threshold (32 MiB) and a thread arena's heap (64 MiB)
    pages = (72 * MiB) // 4096
    faults = faults_per_push(make_cluster, 72 * MiB, push_part_bytes=None)
    assert faults < pages / 50, f"{faults:.0f} minor faults per push of {pages} pages"


def test_ps_takes_no_fresh_pages_per_push_when_a_push_travels_in_parts(make_cluster):
    pages = (40 * MiB) // 4096
    faults = faults_per_push(make_cluster, 40 * MiB, push_part_bytes=256 << 10)
    assert faults < pages / 50, f"{faults:.0f} minor faults per push of {pages} pages"
