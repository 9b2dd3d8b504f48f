"""Launch to first step of the seed job over SSH hosts, beside the same job on this machine.

The seed job (examples/mnist_softmax.py; 1 ps + 2 workers, and 2 ps + 2 workers) is started with
`shoal run`, once with `--hosts` (the SSH executor: hosts checked, agents started, ports held,
tasks started through the agents) and once without (the local executor, the reference). Each
worker prints `step=N` from its first step on (`--log_every 1`), so we measure

  first step:  arrival of the first `step=` line in the launcher's output - t(shoal spawned)
  hosts up:    arrival of the first "STARTING -> RUNNING" line - t(shoal spawned)
               (CLI start-up, placement, the hosts' checks and agents, the ports: before any
               task runs)

and report the medians of --repeat runs and the ratio SSH / local. Goal (issue 11): <= 2 s to
the first step over 3 SSH hosts.

Hosts: `--hosts a,b,c [--ssh-config FILE]` for real machines (the same paths on each), or
`--netns` for three network-namespace hosts with their own sshd on this machine, made with the
test fixtures (tests/multihost; needs root, sshd, iproute2). Every process goes through
bench/jobrun.py (own process group, killed if the benchmark dies).

    sudo .venv/bin/python bench/ssh_launch.py --netns [--repeat 5]
    python bench/ssh_launch.py --hosts node1,node2,node3 [--ssh-config ~/.ssh/config]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/ssh_launch.py`: find the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.jobrun import Job, Launch, Output, clean_env  # noqa: E402

SHOAL = ("-m", "shoal.cli.main")
SHAPES = {"1ps+2w": ("1", "2"), "2ps+2w": ("2", "2")}
STEP = re.compile(r"\| \S+ step=\d+ ")
RUNNING = re.compile(r"STARTING -> RUNNING")


class LaunchFailed(RuntimeError):
    """A benchmarked job did not run to its end."""


def one_launch(shape: str, hosts: list[str], ssh_config: str, home: Path, timeout_s: float) -> tuple[float, float]:
    """(hosts up, first step) in seconds for one run of the seed job."""
    ps, workers = SHAPES[shape]
    where = (["--hosts", ",".join(hosts)] + (["--ssh-config", ssh_config] if ssh_config else [])) if hosts else []
    argv = (*SHOAL, "run", "--name", "bench", "--ps", ps, "--workers", workers, *where, "--",
            "python", "examples/mnist_softmax.py", "--steps", "300", "--log_every", "1")
    with Job() as job:
        t0 = time.monotonic()
        task = job.start(Launch("shoal", argv, clean_env(os.environ, {"SHOAL_HOME": str(home)}),
                                output=Output.CAPTURE))
        codes = job.wait(time.monotonic() + timeout_s)
        if codes.get("shoal") != 0:
            job.close()
            raise LaunchFailed(f"shoal run exited {codes.get('shoal')}; its last lines:\n{task.tail()}")
        lines = list(task.lines)
    up = min(t for t, line in lines if RUNNING.search(line)) - t0
    first = min(t for t, line in lines if STEP.search(line)) - t0
    return up, first


def measure(shape: str, hosts: list[str], ssh_config: str, repeat: int, timeout_s: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        one_launch(shape, hosts, ssh_config, Path(tmp), timeout_s)  # warm: page cache, MNIST .npy cache
        runs = [one_launch(shape, hosts, ssh_config, Path(tmp), timeout_s) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def report(hosts: list[str], ssh_config: str, repeat: int, timeout_s: float) -> None:
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; hosts {','.join(hosts)}")
    print(f"median of {repeat} runs, seconds from `shoal run` spawned\n")
    print(f"{'job':<8} {'executor':<8} {'hosts up':>9} {'first step':>11} {'ssh / local':>12}")
    for shape in SHAPES:
        local = measure(shape, [], "", repeat, timeout_s)
        ssh = measure(shape, hosts, ssh_config, repeat, timeout_s)
        print(f"{shape:<8} {'local':<8} {local[0]:>9.2f} {local[1]:>11.2f}")
        print(f"{shape:<8} {'ssh':<8} {ssh[0]:>9.2f} {ssh[1]:>11.2f} {ssh[1] / local[1]:>11.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="three (or more) ssh destinations, comma-separated")
    where.add_argument("--netns", action="store_true", help="make 3 namespace hosts here (root)")
    parser.add_argument("--ssh-config", default="", help="ssh -F FILE (with --hosts)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120, help="seconds one job may take (default 120)")
    args = parser.parse_args()
    if args.hosts:
        report(args.hosts.split(","), args.ssh_config, args.repeat, args.timeout)
        return 0
    from tests.multihost.network import HostNetwork  # the test fixtures' hosts: netns + sshd
    network = HostNetwork()
    try:
        network.start()
        names = [network.add_host().name for _ in range(3)]
        report(names, str(network.ssh_config), args.repeat, args.timeout)
    finally:
        network.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
