"""The messages between the launcher and a host agent (`shoal.launch.agent`): one JSON object per
line, over the agent's stdin (launcher -> agent) and stdout (agent -> launcher). Over SSH that
is the ssh channel itself, so what travels here (a task's environment, the job secret in it)
never appears on a command line.

Launcher -> agent:
    {"type": "bind", "count": N, "interface": "0.0.0.0", "gpus": BOOL, "request": R}
                                                            bind N ports and hold them (and name
                                                            the GPUs its tasks may use when
                                                            "gpus" is true: visible_gpus.py;
                                                            N may then be 0); R, a number,
                                                            comes back in the answer
    {"type": "start", "task": NAME, "argv": [...], "env": {...}, "cwd": DIR, "port": P | null,
     "inherit": BOOL}                                       release port P, start the task; with
                                                            "inherit" its environment is the
                                                            agent's (the login one) under "env"
    {"type": "signal", "task": NAME, "signal": N}           signal the task's process group
    {"type": "sample", "interval": S}                       CPU and memory of every task
    {"type": "stop", "grace": S}                            TERM every group, KILL after S, exit
    {"type": "heartbeat"}                                   nothing; with --heartbeat S, the agent
                                                            stops everything after S s of silence
    (end of input)                                          the same as stop, grace 2 s
    (SIGTERM or SIGHUP to the agent)                        the same as stop, grace 2 s

Agent -> launcher:
    {"type": "hello", "version": V, "fingerprint": F, "python": PATH, "host": ADDRESS, "pid": PID}
     first line; F is the hash of its Shoal code (fingerprint.py); with "slurm_step": "JOB.STEP"
     when the agent runs as a Slurm step
    {"type": "ports", "ports": [...], "gpus": [ID, ...], "gpus_from": TEXT, "request": R}
     "gpus" (CUDA_VISIBLE_DEVICES names) and "gpus_from" ("CUDA_VISIBLE_DEVICES=..." when the
     agent's environment chose them, else "") only when asked for
    {"type": "started", "task": NAME, "pid": PID, "started": CREATE_TIME}
    {"type": "output", "task": NAME, "data": TEXT}           the task's next output bytes (<= 64 KiB)
    {"type": "exit", "task": NAME, "code": CODE}             after its group is gone
    {"type": "usage", "tasks": {NAME: {"cpu": %, "rss": BYTES, "mem_total": BYTES}}}
    {"type": "error", "message": TEXT}                       a command that could not be done
    {"type": "heartbeat"}                                    with --heartbeat: at least once a second

Output bytes are decoded as UTF-8 with surrogateescape, so any bytes survive the trip
(`line_bytes` restores them). Pure: no I/O here; thread-safe.
"""

from __future__ import annotations

import json
from typing import Any

from shoal.launch.errors import LaunchError

MAX_MESSAGE = 1 << 20
"""The longest line either side accepts (64 KiB of output escapes to at most 384 KiB)."""

LAUNCHER_TYPES = frozenset({"bind", "start", "signal", "sample", "stop", "heartbeat"})
AGENT_TYPES = frozenset({"hello", "ports", "started", "output", "exit", "usage", "error", "heartbeat"})


class AgentProtocolError(LaunchError):
    """A line between the launcher and an agent is not a valid message."""


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line of JSON (ASCII, so any output bytes survive)."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    """The message in `line`; AgentProtocolError unless it is a JSON object of an allowed type."""
    if len(line) > MAX_MESSAGE:
        raise AgentProtocolError(f"a message of {len(line)} bytes is over the {MAX_MESSAGE}-byte limit")
    try:
        message = json.loads(line)
    except ValueError as e:
        raise AgentProtocolError(f"not a JSON message: {line[:120]!r}") from e
    if not isinstance(message, dict) or message.get("type") not in allowed:
        raise AgentProtocolError(f"unknown message {str(message)[:120]!r}; expected one of {sorted(allowed)}")
    return message


def line_text(data: bytes) -> str:
    """Output bytes as text that `line_bytes` turns back into the same bytes."""
    return data.decode("utf-8", "surrogateescape")


def line_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def field(message: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """`message[key]`, checked to be of `kind`; AgentProtocolError naming the field."""
    value = message.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise AgentProtocolError(f"{message.get('type')} message: field {key!r} must be "
                                 f"{getattr(kind, '__name__', kind)}, got {value!r:.80}")
    return value
