"""`code_fingerprint`: a short hash of the Shoal code this process imports, so that two
checkouts with the same package version (0.1.0 in both) but other code tell each other apart.

Both ends compute it the same way: SHA-256 over the sorted paths, relative to the `shoal`
package directory, of every `.py` file under it, each with its bytes (lengths first, so no two
trees hash alike by shifting bytes between files). The launcher compares its own with the one
each host's agent says in its hello (ssh_preflight.py). Computed once per process and cached:
~10 ms for Shoal's ~200 files. Blocks on reading them the first time; thread-safe.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

LENGTH = 16
"""Hex digits kept: enough that two different trees never collide in practice."""


@functools.cache
def code_fingerprint() -> str:
    """The fingerprint of the `shoal` package this process imports (see the module docstring)."""
    return tree_fingerprint(Path(__file__).resolve().parents[1])  # shoal/, without importing the runtime


def tree_fingerprint(root: Path) -> str:
    """The fingerprint of the `.py` files under `root` (not cached)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        name = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        digest.update(len(name).to_bytes(4, "big") + name + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:LENGTH]
