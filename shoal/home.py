"""Where Shoal keeps its files on this machine: `$SHOAL_HOME`, else `~/.shoal`.

The one place this default is computed. Pure: the caller passes the environment in (read once
at the edge); imports nothing of Shoal, so every package may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def shoal_home(environ: Mapping[str, str]) -> Path:
    """`$SHOAL_HOME` (with `~` expanded), else `$HOME/.shoal`. Does no I/O."""
    home = environ.get("SHOAL_HOME")
    if home:
        return Path(home).expanduser()
    user_home = environ.get("HOME")
    return (Path(user_home) if user_home else Path.home()) / ".shoal"
