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


def duration_text(text: str) -> str:
    """A duration of 0 or more, as written ("0", "1s", "10m"): the spec reads it again and
    decides what it means for its field (`--deadline 0` is a spec error there)."""
    try:
        parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration of 0 or more; write e.g. 0, 500ms, 30s or "
                                         "5m") from e
    return text


def duration_or_off_text(text: str) -> str:
    """`duration_text`, or "off"."""
    if text == "off":
        return text
    try:
        return duration_text(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (or off)") from None


def whole_number(text: str) -> int:
    """An integer of 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more; give e.g. 0 or 3")
    return value
