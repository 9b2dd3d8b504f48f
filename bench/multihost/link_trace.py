"""Is a link used both ways at once? Samples one host's link counters every ~0.5 ms for a second
in the middle of a run, and tells the share of time each direction moved data, both did, and
neither did (2 ms bins; a direction is busy in a bin that carried over BUSY of the rate's bytes).

    sudo .venv/bin/python -m bench.multihost.link_trace      # ~1 min, as root; prints one line per run

Runs at 1 Gbit/s: Shoal's MLP (sync and async, 2 ps + 2 workers: a worker's link; async 1 ps +
2 workers: the ps's link) and DDP with 2 ranks (a rank's link). A one-off diagnostic beside
bench/multihost_throughput.py, with its hosts and its runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.multihost.runs import RATES_BPS, Config, System, Where, run_config
from bench.multihost.sampler import Link

BIN_S = 0.002
BUSY = 0.25
RUNS = [  # (configuration, index of the host whose link is traced)
    (Config(System.SHOAL_SSH, "mlp", "sync", 2, 2, "1gbit", "curve"), 2),
    (Config(System.SHOAL_SSH, "mlp", "async", 2, 2, "1gbit", "curve"), 2),
    (Config(System.SHOAL_SSH, "mlp", "async", 1, 2, "1gbit", "curve"), 0),
    (Config(System.DDP, "mlp", "sync", 0, 2, "1gbit", "-"), 1),
]


def trace(veth: str, start_after: float, seconds: float, out: list) -> None:
    """Append (time, bytes in, bytes out) of `veth` every ~0.5 ms for `seconds`, after `start_after`."""
    time.sleep(start_after)
    with open(f"/sys/class/net/{veth}/statistics/tx_bytes") as fin, \
            open(f"/sys/class/net/{veth}/statistics/rx_bytes") as fout:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            fin.seek(0)
            fout.seek(0)
            out.append((time.monotonic(), int(fin.read()), int(fout.read())))
            time.sleep(0.0005)


def shares(samples: list, rate_bps: float) -> dict[str, float]:
    """Share of the traced time each direction was busy, both were, neither was."""
    if len(samples) < 2:
        return {}
    counts = {"in": 0, "out": 0, "both": 0, "neither": 0}
    bins = 0
    t, i, o = samples[0]
    for t1, i1, o1 in samples[1:]:
        if t1 - t < BIN_S:
            continue
        busy_in = (i1 - i) > BUSY * rate_bps * (t1 - t)
        busy_out = (o1 - o) > BUSY * rate_bps * (t1 - t)
        counts["in"] += busy_in
        counts["out"] += busy_out
        counts["both"] += busy_in and busy_out
        counts["neither"] += not (busy_in or busy_out)
        bins += 1
        t, i, o = t1, i1, o1
    return {k: round(v / bins, 3) for k, v in counts.items()}


def main() -> int:
    from shoal.datasets.mnist import default_cache_dir
    from tests.multihost.network import HostNetwork

    network = HostNetwork()
    try:
        network.start()
        hosts = [network.add_host() for _ in range(4)]
        for host in hosts:
            host.shape("1gbit")
        links = tuple(Link(h.name, h.veth, h.netns) for h in hosts)
        with tempfile.TemporaryDirectory(prefix="shoal-bench-trace-") as home:
            where = Where(tuple(h.name for h in hosts), tuple(h.address for h in hosts), links,
                          str(network.ssh_config), Path(home), default_cache_dir(os.environ), sys.executable)
            for config, index in RUNS:
                samples: list = []
                tracer = threading.Thread(target=trace, args=(hosts[index].veth, 6.0, 1.0, samples))
                tracer.start()
                run = run_config(config, where, 80_000, 120)
                tracer.join()
                print(f"{config.key}: {hosts[index].name}'s link, {run.get('examples_per_s')} ex/s, "
                      f"{run.get('fraction_of_link_bound')} of the bound; busy share of the time "
                      f"{shares(samples, RATES_BPS['1gbit'])}", flush=True)
    finally:
        network.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
