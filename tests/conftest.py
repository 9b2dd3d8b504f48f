"""Suite-wide pytest configuration."""

import os

import pytest

from tests import ci_skips


def pytest_configure(config: pytest.Config) -> None:
    # In CI (SHOAL_CI=1) a skipped test fails the session: see tests/ci_skips.py.
    ci_skips.install(config, os.environ)
