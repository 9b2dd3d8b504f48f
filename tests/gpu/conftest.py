"""GPU tests: they need an NVIDIA GPU with CUDA, which CI does not have, so `pytest` alone does
not collect them (tests/conftest.py); run them by name on such a machine: `pytest tests/gpu`.
Elsewhere they are skipped, saying why."""

from pathlib import Path

import pytest

from tests.cluster.conftest import make_cluster  # a fixture these tests use too

__all__ = ["make_cluster"]

HERE = Path(__file__).resolve().parent


def _why_no_gpu() -> str:
    try:
        import torch
    except ImportError:
        return "needs PyTorch (pip install torch) and an NVIDIA GPU"
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False here)"
    return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _why_no_gpu()
    if why:
        for item in items:
            if HERE in Path(item.fspath).resolve().parents:
                item.add_marker(pytest.mark.skip(reason=why))
