"""Small pieces of the wording that messages share: counts with their nouns, sizes."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """`count` and `noun`, the noun plural unless the count is 1: "1 task", "0 tasks", "3 GPUs".
    Takes nouns whose plural adds an "s". Does not block."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def byte_size(nbytes: int) -> str:
    """A size in bytes as a person reads it: "512 B", "30.6 KiB", "1.5 MiB", "2.0 GiB". Does not block."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
