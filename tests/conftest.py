"""Suite-wide pytest configuration."""

import os
from pathlib import Path

import pytest

from tests import ci_skips


def pytest_configure(config: pytest.Config) -> None:
    # In CI (SHOAL_CI=1) a skipped test fails the session: see tests/ci_skips.py.
    ci_skips.install(config, os.environ)


GPU_TESTS = Path(__file__).resolve().parent / "gpu"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/gpu needs an NVIDIA GPU, which CI has not: it is collected only when named
    (`pytest tests/gpu`, or a file or test in it), never by a plain `pytest`."""
    if collection_path.resolve() != GPU_TESTS:
        return None
    for arg in config.args:
        named = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if named == GPU_TESTS or GPU_TESTS in named.parents:
            return None
    return True
