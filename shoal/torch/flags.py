"""`add_flags`: a PyTorch program's command line gets the cluster and training flags, except
those it defines itself (its own --steps, --model_dir, ... keep their meaning and defaults).

Pure argparse; the caller passes the environment in (for --model_dir's default, $OUTPUT_DIR).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from shoal.cluster import add_cluster_flags
from shoal.train.flags import add_training_flags


def add_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Add the cluster flags (--ps_hosts, --worker_hosts, --job_name, ...) and the training
    flags (--sync, --steps, --model_dir, --log_every, checkpoints, --wire_security, --wire_shared_memory) to `parser`,
    leaving out any flag the parser already has: a program's own `--steps` or `--model_dir`
    is used as it is, and must mean the same (global steps; the job's model directory)."""
    adder = _KeepExisting(parser)
    add_cluster_flags(adder)  # type: ignore[arg-type]
    add_training_flags(adder, environ)  # type: ignore[arg-type]


class _KeepExisting:
    """Forwards `add_argument` to an argparse parser or group, skipping flags it already has."""

    def __init__(self, target: Any):
        self._target = target

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        try:
            return self._target.add_argument(*names, **kwargs)
        except argparse.ArgumentError as e:
            if "conflicting option" not in str(e):
                raise
            return None  # the program defines this flag itself

    def add_mutually_exclusive_group(self, *args: Any, **kwargs: Any) -> "_KeepExisting":
        return _KeepExisting(self._target.add_mutually_exclusive_group(*args, **kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> "_KeepExisting":
        return _KeepExisting(self._target.add_argument_group(*args, **kwargs))
