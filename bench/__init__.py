"""Benchmarks: Shoal measured against a reference run in the same process tree. Not run by CI.

Every figure is a ratio (or sits next to its reference) measured in one run, interleaving the
two sides, because the machines we run on are small and shared. See bench/README.md.

Shared here: where the repository is, free ports, the median, a table cell (`fmt`), and what machine ran the figures.
Every process a benchmark starts goes through bench/jobrun.py; what is sampled of it (peak
RSS, CPU) is defined in bench/usage.py.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

from shoal.launch.ports import free_ports  # noqa: F401 (the benchmarks import it from here)

REPO = Path(__file__).resolve().parents[1]


def median_of_present(values) -> float | None:
    """The median of the values that are not None; None if there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def rounded(value, digits: int = 0):
    """`value` rounded to `digits` (an int when 0); None stays None."""
    if value is None:
        return None
    return round(value, digits) if digits else round(value)


def fmt(value, spec: str = "", empty: str = "-") -> str:
    """`value` formatted with `spec`, or `empty` for None (a figure not measured)."""
    return empty if value is None else format(value, spec)


def median(values) -> float:
    return statistics.median(values)


def machine() -> dict:
    """What the figures were measured on (they mean little without it)."""
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}
