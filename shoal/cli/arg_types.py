"""argparse types shared by the subcommands: values checked where they are parsed, so a bad one
is a usage error (exit 2) that names it, never a traceback later. Pure."""

from __future__ import annotations

import argparse

from shoal.launch.spec import parse_duration


def positive_duration(text: str) -> float:
    """Seconds from "2", "0.5", "500ms", "30s" or "5m" (as the spec's durations); more than 0."""
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 2, 500ms, 30s or 5m") from e
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not more than 0 seconds; give e.g. 2, 500ms or 30s")
    return seconds
