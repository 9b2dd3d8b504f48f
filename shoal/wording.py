"""Small pieces of the wording that messages share."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """`count` and `noun`, the noun plural unless the count is 1: "1 task", "0 tasks", "3 GPUs".
    Takes nouns whose plural adds an "s". Does not block."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
