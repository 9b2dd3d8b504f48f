"""One measured run of multihost_throughput: a configuration, how its processes start, and the
figures taken from its output and its sampler.

Systems:

    shoal-ssh    `shoal run --ps P --workers W --hosts host1,...,hostN --ssh-config F -- python
                 examples/<model>.py ...`: the SSH executor; ps.i on host i+1, the workers on
                 the hosts after them (one task per host), or, for a `/colocated` shape, worker.i
                 next to ps.i on host i+1 (a worker reaches its own host's ps through shared
                 memory). Between hosts the wire is CURVE (AUTO), or PLAIN with
                 `--wire_security plain`.
    shoal-local  the same `shoal run` without --hosts: the local executor, every task on
                 127.0.0.1 in the root namespace (PLAIN, as AUTO means on loopback).
    ddp          bench/peers/torch_ddp.py (PyTorch DDP, gloo), rank r inside host r+1's
                 namespace (`ip netns exec`), MASTER_ADDR = host1; no ssh, no launcher.

Figures (see bench/README.md, "multihost_throughput"):

    examples/s   each worker's progress lines, timestamped on arrival here (through the
                 launcher's output for Shoal, the rank's own stdout for DDP). Window: from the
                 latest worker's line at 10% of its lines to the earliest worker's last line;
                 examples = lines in the window x the examples each line stands for.
    link bytes   interface bytes of each host's link in the window (interpolated samples),
                 scaled by that link's tbf/interface factor over the run when it is shaped;
                 the busiest host and direction sets the link bound:
                 rate (bytes/s) / (its bytes per example).
    CPU          CPU seconds per example in the window, by role; the machine's busy share.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from bench.example_modes import MODE_FLAGS
from bench.jobrun import Job, Launch, Output, Task, clean_env
from bench.multihost.sampler import DIRECTIONS, Link, RunSampler, Sampled
from bench.usage import interpolate

BATCH = 100
EXAMPLES = {"softmax": "examples/mnist_softmax.py", "mlp": "examples/mnist_mlp_torch.py"}
# Local steps per progress line: a line every ~20-50 ms per worker (the lines cross ssh, the
# agent and the launcher; one per step would cost the 2 cores more than the training).
LOG_EVERY = {"softmax": 10, "mlp": 4}
RATES_BPS = {"1gbit": 1e9 / 8, "10gbit": 1e10 / 8}  # tc's units are SI: 1gbit = 10^9 bit/s
# a progress line, of shoal.ProgressReporter (examples/s, then step_ms=... p95_ms=... applied=...) or an example's own
SHOAL_LINE = re.compile(r"^\S+\.(worker\.\d+) \| (?:\S+ )?step=\d+ loss=\S+ examples/s=\d+(?: \S+=\S+)*$")
DDP_LINE = re.compile(r"^step=\d+ examples=(\d+)$")
ACCURACY = re.compile(r"accuracy: (\d+\.\d+)$")
ROLES = ("ps", "worker", "agent", "sshd", "launcher", "other")
WINDOW_FROM = 0.1  # the window starts at each worker's line at this fraction of its lines
COLOCATED = "/colocated"  # shape suffix: ps.i and worker.i share host i+1 (the SSH executor's placement)


class System(Enum):
    SHOAL_SSH = "shoal-ssh"
    SHOAL_LOCAL = "shoal-local"
    DDP = "ddp"


@dataclass(frozen=True)
class Config:
    """One measured configuration. `ps` is 0 for DDP; `link` is "loopback" for shoal-local;
    `security` is "curve" (AUTO between hosts), "plain", or "-" (DDP has none)."""

    system: System
    model: str
    mode: str
    ps: int
    workers: int
    link: str
    security: str
    push: str = "parts"  # "whole": the examples' --push_part_bytes 0, one push message per ps
    colocated: bool = False  # one ps and one worker on each host (ps == workers), not one task per host

    @property
    def hosts(self) -> int:
        if self.system is System.SHOAL_LOCAL:
            return 0
        return self.workers if self.colocated else self.ps + self.workers

    @property
    def shape(self) -> str:
        base = f"{self.ps}ps+{self.workers}w" if self.ps else f"{self.workers}w"
        return base + COLOCATED if self.colocated else base

    @property
    def key(self) -> str:
        whole = " whole-push" if self.push == "whole" else ""
        return f"{self.system.value} {self.model} {self.mode} {self.shape} {self.link} {self.security}{whole}"

    def as_dict(self) -> dict:
        return dict(asdict(self), system=self.system.value, shape=self.shape, hosts=self.hosts)


@dataclass(frozen=True)
class Where:
    """What a run needs of the bench's hosts: per host (in order) its name, address and link."""

    names: tuple[str, ...]
    addresses: tuple[str, ...]
    links: tuple[Link, ...]
    ssh_config: str
    shoal_home: Path
    mnist_dir: Path
    ddp_python: str


def steps_for(config: Config, examples: int) -> int:
    """Global steps that train about `examples` examples: a Shoal async step is one worker's
    batch, a sync step (and a DDP step) every worker's."""
    per_step = BATCH * (config.workers if config.mode == "sync" else 1)
    return max(10, examples // per_step)


def shoal_argv(config: Config, where: Where, examples: int) -> tuple[str, ...]:
    hosts = []
    if config.system is System.SHOAL_SSH:
        hosts = ["--hosts", ",".join(where.names[:config.hosts]), "--ssh-config", where.ssh_config]
    program = ["python", EXAMPLES[config.model], "--steps", str(steps_for(config, examples)),
               "--log_every", str(LOG_EVERY[config.model])]
    program += MODE_FLAGS[config.mode]
    # On loopback AUTO is PLAIN already; between hosts AUTO is CURVE unless told otherwise.
    program += ["--wire_security", "plain"] if config.security == "plain" and config.hosts else []
    program += ["--push_part_bytes", "0"] if config.push == "whole" else []
    return ("-m", "shoal.cli.main", "run", "--name", "mh", "--ps", str(config.ps), "--workers",
            str(config.workers), *hosts, "--", *program)


def ddp_launches(config: Config, where: Where, examples: int) -> list[Launch]:
    """One Launch per rank, each inside its host's namespace."""
    launches = []
    for rank in range(config.workers):
        env = clean_env(os.environ, {"RANK": str(rank), "WORLD_SIZE": str(config.workers),
                                     "MASTER_ADDR": where.addresses[0], "MASTER_PORT": "29500",
                                     "GLOO_SOCKET_IFNAME": "eth0"})
        argv = ("netns", "exec", where.links[rank].netns, where.ddp_python, "bench/peers/torch_ddp.py",
                "--model", config.model, "--steps", str(steps_for(config, examples)), "--data",
                str(where.mnist_dir), "--eval_every", str(10**12))
        launches.append(Launch(f"rank{rank}", argv, env, program="ip", output=Output.CAPTURE))
    return launches


def run_config(config: Config, where: Where, examples: int, timeout_s: float) -> dict:
    """Run `config` once and measure it. Blocks until its processes exit (<= timeout_s)."""
    links = list(where.links[:config.hosts])
    sampler = RunSampler(links)
    job = Job()
    try:
        sampler.start()
        if config.system is System.DDP:
            for launch in ddp_launches(config, where, examples):
                job.start(launch)
        else:
            env = clean_env(os.environ, {"SHOAL_HOME": str(where.shoal_home)})
            task = job.start(Launch("shoal", shoal_argv(config, where, examples), env, output=Output.CAPTURE))
            sampler.add_root(task.pid)
        codes = job.wait(job.launched + timeout_s, until_failure=True)
        ended = time.monotonic()
    finally:
        job.close()
        sampler.close()
    return measure(config, job.tasks, codes, sampler.sampled, ended - job.launched)


def progress(config: Config, tasks: list[Task]) -> tuple[dict[str, list[float]], int]:
    """Per worker, the arrival times of its progress lines; and the examples one line stands for."""
    if config.system is System.DDP:
        return {t.name: [at for at, line in t.lines if DDP_LINE.match(line)] for t in tasks}, BATCH
    times: dict[str, list[float]] = {}
    for at, line in tasks[0].lines:
        if m := SHOAL_LINE.match(line):
            times.setdefault(m.group(1), []).append(at)
    return times, LOG_EVERY[config.model] * BATCH


def window_bytes(sampled: Sampled, start: float, end: float, link: str) -> dict[str, dict]:
    """Per 'host direction': interface bytes in the window, the tbf factor, the bytes tbf counts."""
    out = {}
    for (host, direction), series in sampled.link_bytes.items():
        iface = interpolate(series, end) - interpolate(series, start)
        factor = 1.0
        if link in RATES_BPS and (host, direction) in sampled.tbf_bytes:
            t0, t1 = sampled.tbf_bytes[(host, direction)]
            i0, i1 = sampled.iface_bytes[(host, direction)]
            factor = (t1 - t0) / (i1 - i0) if i1 > i0 else 1.0
        out[f"{host} {direction}"] = {"iface": round(iface), "tbf_factor": round(factor, 4),
                                      "bytes": round(iface * factor)}
    return out


def measure(config: Config, tasks: list[Task], codes: dict, sampled: Sampled, wall_s: float) -> dict:
    run = {"config": config.as_dict(), "key": config.key, "exit_codes": codes, "wall_s": round(wall_s, 2)}
    times, per_line = progress(config, tasks)
    ok = all(c == 0 for c in codes.values()) and len(times) == config.workers and all(len(v) >= 5 for v in
                                                                                       times.values())
    run["ok"] = ok
    if not ok:
        run["error"] = {t.name: t.tail(25) for t in tasks}
        return run
    start = max(ts[int(len(ts) * WINDOW_FROM)] for ts in times.values())
    end = min(ts[-1] for ts in times.values())
    lines = sum(1 for ts in times.values() for t in ts if start < t <= end)
    examples = lines * per_line
    window = end - start
    if window <= 0 or examples == 0:
        run.update(ok=False, error={"window": f"no overlap of the workers' progress ({window:.3f} s)"})
        return run
    eps = examples / window
    links = window_bytes(sampled, start, end, config.link)
    busiest = max(links, key=lambda k: links[k]["bytes"]) if links else None
    bytes_per_example = links[busiest]["bytes"] / examples if busiest else None
    rate = RATES_BPS.get(config.link)
    bound = rate / bytes_per_example if rate and bytes_per_example else None
    # How full each direction of the busiest host's link was: sync steps that upload, then
    # download, use one direction at a time.
    utilization = None
    if rate and busiest:
        host = busiest.rsplit(" ", 1)[0]
        utilization = {d: round(links[f"{host} {d}"]["bytes"] / (rate * window), 3) for d in DIRECTIONS
                       if f"{host} {d}" in links}
    cpu_by_role = {role: 0.0 for role in ROLES}
    for pid, series in sampled.process_cpu.items():
        cpu_by_role[sampled.roles[pid]] += interpolate(series, end) - interpolate(series, start)
    busy = interpolate(sampled.machine_cpu, end) - interpolate(sampled.machine_cpu, start)
    ours = sum(cpu_by_role.values())
    cores = os.cpu_count() or 1
    accuracies = [float(m.group(1)) for t in tasks for _, line in t.lines if (m := ACCURACY.search(line))]
    run.update({
        "examples_per_s": round(eps), "window_s": round(window, 3), "examples": examples,
        "link_bytes": links, "busiest_link": busiest,
        "bytes_per_example": round(bytes_per_example, 1) if bytes_per_example else None,
        "link_bound_examples_per_s": round(bound) if bound else None,
        "fraction_of_link_bound": round(eps / bound, 3) if bound else None,
        "busiest_host_link_utilization": utilization,
        "cpu_us_per_example": {r: round(v / examples * 1e6, 1) for r, v in cpu_by_role.items()},
        "cpu_us_per_example_total": round(ours / examples * 1e6, 1),
        "busy_share": round(busy / (window * cores), 3),
        "others_share": round(max(0.0, busy - ours) / (window * cores), 3),
        "accuracy_min": min(accuracies) if accuracies else None,
        "lines_per_worker": {k: len(v) for k, v in times.items()},
    })
    return run
