"""The links' own reference: one raw TCP stream from host2 to host1 (bench/multihost/tcp_blast.py),
what a link at this setting gives a stream that does nothing but send.

Reported: payload MB/s at the receiver, and the bytes the shaper counted per second over the
stream as a fraction of the rate (1.0 = the link full, as tbf sees it).
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench.jobrun import Job, Launch, Output, clean_env
from bench.multihost.sampler import Link, tbf_bytes

BLAST = "bench/multihost/tcp_blast.py"
PORT = "5201"


def tcp_reference(receiver: Link, receiver_address: str, sender: Link, rate_bps: float | None,
                  seconds: float = 1.0) -> dict:
    """Stream for `seconds` from `sender` to `receiver`; blocks ~seconds + 1 s."""
    env = clean_env(os.environ)
    before = tbf_bytes(receiver).get("in")
    with Job() as job:
        server = job.start(Launch("recv", ("netns", "exec", receiver.netns, sys.executable, BLAST, "serve", PORT),
                                  env, program="ip", output=Output.CAPTURE))
        deadline = time.monotonic() + 10
        while not any(line == "ready" for _, line in server.lines) and time.monotonic() < deadline:
            time.sleep(0.02)
        job.start(Launch("send", ("netns", "exec", sender.netns, sys.executable, BLAST, "send", receiver_address,
                                  PORT, str(seconds)), env, program="ip", output=Output.DISCARD))
        job.wait(time.monotonic() + seconds + 10)
    after = tbf_bytes(receiver).get("in")
    results = [json.loads(line) for _, line in server.lines if line.startswith("{")]
    if not results or not results[0]["seconds"]:
        return {"ok": False, "output": server.tail()}
    got = results[0]
    out = {"ok": True, "payload_mb_per_s": round(got["bytes"] / got["seconds"] / 1e6, 1)}
    if rate_bps and before is not None and after is not None:
        out["tbf_fraction_of_rate"] = round((after - before) / got["seconds"] / rate_bps, 3)
    return out
