"""The systems compared, as pure data: for a model and a number of examples, the tasks to start
(program, interpreter, environment, and how each one ends). Nothing here starts a process.

Every system trains the same models (the seed's softmax, lr 0.5; a 784-256-10 MLP, lr 0.1)
with plain SGD on batches of 100 per worker, on MNIST's 60,000 training images. A global step
is one update of the parameters: 100 examples for the asynchronous systems, 100 x workers for
the synchronous ones, so a run of N examples is N / examples_per_step global steps.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass
from enum import Enum

from bench import free_ports

BATCH = 100
SHOAL_EXAMPLES = {"softmax": "examples/mnist_softmax.py", "mlp": "examples/mnist_mlp_torch.py"}
MODELS = tuple(SHOAL_EXAMPLES)
COORD_EXAMPLES = {"softmax": "examples/mnist_coordinator.py"}  # Shoal in-graph: the seed's softmax only


class End(Enum):
    """How a task ends. EXITS: by itself, with status 0 (or the run failed). MAY_HANG: by
    itself, but it may block forever once the EXITS tasks are done (TF1's non-chief
    SyncReplicas worker waiting for a token); killed after a grace period, judged by its
    output. SERVES: never by itself (TensorFlow's ps and TF2 workers); killed at the end."""

    EXITS = "exits"
    MAY_HANG = "may_hang"
    SERVES = "serves"


@dataclass(frozen=True)
class TaskSpec:
    """One process: `python argv...` from the repository root with `env` added."""

    name: str
    python: str
    argv: tuple[str, ...]
    env: dict
    end: End


@dataclass(frozen=True)
class JobSpec:
    system: str
    model: str
    steps: int
    examples_per_step: int
    tasks: tuple[TaskSpec, ...]
    line_examples: int = BATCH  # examples one Shoal progress line (`step=N loss=X examples/s=R`) stands for

    def describe(self) -> str:
        return "\n".join(f"{t.name:9} [{t.end.value}] {' '.join(t.argv)}" for t in self.tasks)


@dataclass(frozen=True)
class System:
    """A system under test. `kind` picks the builder; `peer` says it runs in the peers' venv."""

    name: str
    kind: str
    sync: bool
    peer: bool
    compare_with: str | None = None  # the Shoal system a peer is paired with
    steps_per_dispatch: int = 1
    venv: bool = True  # a peer that runs in the peers' virtualenv (TensorFlow, its torch)
    against: tuple[str, ...] = ()  # a Shoal system's own references: runs next to each, ratio = it / them
    models: tuple[str, ...] = MODELS  # the models it can train

    def examples_per_step(self, workers: int = 2) -> int:
        return BATCH * (workers if self.sync else 1)


SYSTEMS = {s.name: s for s in (
    System("shoal-async", "shoal", sync=False, peer=False),
    System("shoal-sync", "shoal", sync=True, peer=False),
    System("tf1-async", "tf1", sync=False, peer=True, compare_with="shoal-async"),
    System("tf1-sync", "tf1", sync=True, peer=True, compare_with="shoal-sync"),
    System("tf2-ps-k1", "tf2ps", sync=False, peer=True, compare_with="shoal-async", steps_per_dispatch=1),
    System("tf2-ps-k10", "tf2ps", sync=False, peer=True, compare_with="shoal-async", steps_per_dispatch=10),
    # Shoal in-graph (shoal.Coordinator), against TF2's coordinator at the same steps per dispatch (issue 15)
    System("shoal-coord-k1", "coord", sync=False, peer=False, steps_per_dispatch=1, against=("tf2-ps-k1",),
           models=tuple(COORD_EXAMPLES)),
    System("shoal-coord-k10", "coord", sync=False, peer=False, steps_per_dispatch=10,
           against=("tf2-ps-k10", "shoal-async"), models=tuple(COORD_EXAMPLES)),
    System("tf-mwms", "mwms", sync=True, peer=True, compare_with="shoal-sync"),
    System("torch-ddp", "ddp", sync=True, peer=True, compare_with="shoal-sync"),
    # the no-communication bound: each worker's loop with no ps and no exchange (bench/nocomm.py)
    System("nocomm", "nocomm", sync=True, peer=True, compare_with="shoal-sync", venv=False),
)}


@dataclass(frozen=True)
class Context:
    """What the builders need from the run: interpreters, the MNIST folder, limits."""

    shoal_python: str
    peers_python: str | None
    mnist_dir: str
    max_seconds: float  # peers that can stop on time (TF1, TF2 PS) stop this long after their first step
    eval_every: int = 5000  # examples between the peers' test evaluations


def build(system: System, model: str, examples: int, ctx: Context, workers: int = 2, log_every: int = 1) -> JobSpec:
    """The job that trains `model` on `system` for about `examples` examples."""
    if model not in system.models:
        raise ValueError(f"system {system.name} cannot train model {model!r}; it trains {', '.join(system.models)}: "
                         f"leave it out of --systems or pick --models {','.join(system.models)}")
    per_step = system.examples_per_step(workers)
    steps = max(1, examples // per_step)
    if system.steps_per_dispatch > 1:
        steps = max(system.steps_per_dispatch, steps // system.steps_per_dispatch * system.steps_per_dispatch)
    builder = {"shoal": _shoal, "coord": _coord, "tf1": _tf1, "tf2ps": _tf2ps, "mwms": _mwms, "ddp": _ddp,
               "nocomm": _nocomm}[system.kind]
    # the coordinator's chief prints one line per finished dispatch: steps_per_dispatch batches
    line_examples = BATCH * (system.steps_per_dispatch if system.kind == "coord" else 1)
    return JobSpec(system.name, model, steps, per_step, builder(system, model, steps, ctx, workers, log_every),
                   line_examples)


def pairs(selected: list[str], model: str | None = None) -> list[tuple[str | None, str | None]]:
    """The (Shoal system, reference) pairs that run next to each other, among the selected
    systems that can train `model` (None: any): every peer with the Shoal system it is compared
    with (None when that one is not selected), then every Shoal system with its own references;
    a selected system in no pair runs alone, as (it, None)."""
    chosen = [s for s in SYSTEMS.values() if s.name in selected and (model is None or model in s.models)]
    names = {s.name for s in chosen}
    out = [(p.compare_with if p.compare_with in names else None, p.name) for p in chosen if p.peer]
    out += [(s.name, ref) for s in chosen if not s.peer for ref in s.against if ref in names]
    paired = {name for pair in out for name in pair}
    return out + [(s.name, None) for s in chosen if s.name not in paired]


def _tf_config(cluster: dict, job: str, index: int) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})}


def _cluster(**jobs: int) -> dict:
    ports = iter(free_ports(sum(jobs.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items() if n}


def _peer_flags(model: str, steps: int, ctx: Context, timed: bool) -> tuple[str, ...]:
    flags = ("--model", model, "--steps", str(steps), "--data", ctx.mnist_dir, "--eval_every", str(ctx.eval_every))
    return flags + (("--max_seconds", str(ctx.max_seconds)) if timed else ())


def _peers_python(ctx: Context) -> str:
    if ctx.peers_python is None:
        raise RuntimeError("a peer system was selected but the peers' virtualenv is not set up")
    return ctx.peers_python


def _shoal(system, model, steps, ctx, workers, log_every):
    cluster = _cluster(ps=2, worker=workers)
    secret = {"SHOAL_JOB_SECRET": secrets.token_hex(16)}
    argv = (SHOAL_EXAMPLES[model], "--steps", str(steps), "--log_every", str(log_every),
            *(("--sync",) if system.sync else ()))
    return tuple(TaskSpec(f"{job}:{i}", ctx.shoal_python or sys.executable, argv,
                          {**_tf_config(cluster, job, i), **secret}, End.EXITS)
                 for job in ("ps", "worker") for i in range(len(cluster[job])))


def _coord(system, model, steps, ctx, workers, log_every):
    """Shoal in-graph: the chief coordinates (no training of its own), as TF2's chief does."""
    cluster = _cluster(chief=1, worker=workers, ps=2)
    secret = {"SHOAL_JOB_SECRET": secrets.token_hex(16)}
    # --log_every 1: the chief prints one line per finished dispatch, which build() counts as K batches
    argv = (COORD_EXAMPLES[model], "--steps", str(steps), "--log_every", "1",
            "--steps_per_dispatch", str(system.steps_per_dispatch))
    python = ctx.shoal_python or sys.executable
    return tuple(TaskSpec(f"{job}:{i}", python, argv, {**_tf_config(cluster, job, i), **secret}, End.EXITS)
                 for job in ("ps", "worker", "chief") for i in range(len(cluster[job])))


def _tf1(system, model, steps, ctx, workers, log_every):
    cluster = _cluster(ps=2, worker=workers)
    argv = ("bench/peers/tf1_graph.py", *_peer_flags(model, steps, ctx, timed=True),
            *(("--sync",) if system.sync else ()))
    python = _peers_python(ctx)
    tasks = [TaskSpec(f"ps:{i}", python, argv, _tf_config(cluster, "ps", i), End.SERVES) for i in range(2)]
    tasks += [TaskSpec(f"worker:{i}", python, argv, _tf_config(cluster, "worker", i),
                       End.MAY_HANG if system.sync and i > 0 else End.EXITS) for i in range(workers)]
    return tuple(tasks)


def _tf2ps(system, model, steps, ctx, workers, log_every):
    cluster = _cluster(chief=1, worker=workers, ps=2)
    argv = ("bench/peers/tf2_ps.py", *_peer_flags(model, steps, ctx, timed=True),
            "--steps_per_dispatch", str(system.steps_per_dispatch))
    python = _peers_python(ctx)
    # servers first, so the coordinator finds them up
    tasks = [TaskSpec(f"ps:{i}", python, argv, _tf_config(cluster, "ps", i), End.SERVES) for i in range(2)]
    tasks += [TaskSpec(f"worker:{i}", python, argv, _tf_config(cluster, "worker", i), End.SERVES)
              for i in range(workers)]
    tasks.append(TaskSpec("chief:0", python, argv, _tf_config(cluster, "chief", 0), End.EXITS))
    return tuple(tasks)


def _mwms(system, model, steps, ctx, workers, log_every):
    cluster = _cluster(worker=workers)
    argv = ("bench/peers/tf_mwms.py", *_peer_flags(model, steps, ctx, timed=False))
    python = _peers_python(ctx)
    return tuple(TaskSpec(f"worker:{i}", python, argv, _tf_config(cluster, "worker", i), End.EXITS)
                 for i in range(workers))


def _ddp(system, model, steps, ctx, workers, log_every):
    port = free_ports(1)[0]
    argv = ("bench/peers/torch_ddp.py", *_peer_flags(model, steps, ctx, timed=False))
    python = _peers_python(ctx)
    return tuple(TaskSpec(f"worker:{i}", python, argv,
                          {"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(workers),
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}, End.EXITS)
                 for i in range(workers))


def _nocomm(system, model, steps, ctx, workers, log_every):
    argv = ("bench/nocomm.py", "--model", model, "--steps", str(steps), "--replicas", str(workers))
    return tuple(TaskSpec(f"worker:{i}", ctx.shoal_python or sys.executable, (*argv, "--replica", str(i)), {},
                          End.EXITS) for i in range(workers))
