"""tests/gpu needs an NVIDIA GPU, which CI has not: a plain `pytest` (CI's) does not collect it,
so no GPU test is ever skipped there; naming it (`pytest tests/gpu`, or one file) collects it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_plain_run_leaves_the_gpu_tests_out_and_naming_them_collects_them():
    everything = collected()
    assert len(everything) > 1000 and not [t for t in everything if t.startswith("tests/gpu/")]
    named = collected("tests/gpu")
    assert all(t.startswith("tests/gpu/") for t in named)
    assert any(t.startswith("tests/gpu/test_gpu_launcher.py::") for t in named)  # (it imports no torch)
    one = collected("tests/gpu/test_gpu_agent.py")
    assert one and all(t.startswith("tests/gpu/test_gpu_agent.py::") for t in one)
