"""`init`: the one call at the top of a PyTorch program that finds out what this task is.

It resolves the cluster (the classic flags, else TF_CONFIG), and then:

- on a ps task (or an evaluator, which this API has no loop for), serves until the job is
  over and ends the process with exit status 0 (SystemExit): it never returns there, so the
  rest of the program is the training replicas' (as with TensorFlow's `server.join()`);
- on a chief or worker, returns the `Job` to hand to DistributedOptimizer and DistributedSampler;
- with no cluster at all (no cluster flags, no TF_CONFIG), starts a ps in this process
  (`shoal.create_local_server`), so the same script trains alone under plain `python`.

Imports no torch: a ps task stays small.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.cluster import ClusterConfig, resolve_cluster_config
from shoal.cluster.flags import CLUSTER_FLAG_DESTS
from shoal.job_secret import resolve_job_secret
from shoal.logs_default import show_shoal_logs
from shoal.torch.lease_link import LeaseLink
from shoal.train.flags import add_training_flags, replication_options, session_options
from shoal.train.local import LocalCluster, create_local_server
from shoal.train.roles import serve_unless_training
from shoal.wire import JobSecret, Security


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """This replica's place in the job, and how its TrainingSession is to be made.

    `session_options` are TrainingSession keyword arguments (sync, max_steps, model_dir,
    checkpoints, security, ...). `local` is the in-process ps when there is no cluster.
    `leases` joins a LeasedSampler to the DistributedOptimizer (not thread-safe). Pure data but
    for those and `close()`, which stops that ps (idempotent); thread-safe.
    """

    config: ClusterConfig
    secret: JobSecret = field(repr=False)
    session_options: Mapping[str, Any]
    local: LocalCluster | None = None
    leases: LeaseLink = field(default_factory=LeaseLink, repr=False, compare=False)

    @property
    def task(self) -> str:
        return str(self.config.task)

    @property
    def is_chief(self) -> bool:
        """Whether this replica is the chief: the one that saves checkpoints (and whose buffers they hold)."""
        return self.config.is_chief

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas

    @property
    def replica_index(self) -> int:
        """0 .. num_replicas - 1 (the chief is 0): this replica's data shard."""
        return self.config.replica_index

    def close(self) -> None:
        """Stop the in-process ps, if there is one. Idempotent."""
        if self.local is not None:
            self.local.close()


def init(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None,
         **session: Any) -> Job:
    """This task's Job; on a ps task, serve until the job is over and raise SystemExit(0).

    `args` holds the parsed flags (see `shoal.torch.add_flags`): the cluster flags, if given,
    win over TF_CONFIG; the training flags (--sync, --steps, --model_dir, ...) become the
    session options, with their defaults where `args` lacks one or holds None. `environ` is
    the environment (pass `os.environ`): TF_CONFIG, the job secret, $OUTPUT_DIR. `session`
    overrides single TrainingSession options (e.g. `request_timeout_s=30`).

    Blocks for the whole job on a ps; returns at once on a replica (it connects to nothing).
    Raises ClusterError for a bad cluster description, SecretError for a missing secret.
    """
    show_shoal_logs()  # what init says (training alone, waiting for the ps) reaches a program without logging
    environ = environ if environ is not None else {}
    flags = _flags(args, environ)
    options = session_options(flags)
    options.update(session)
    if not _names_a_cluster(args, environ):
        local = create_local_server()
        log.info("no cluster given (no TF_CONFIG, no --ps_hosts/--worker_hosts): training alone, with a ps "
                 "in this process")
        options["security"] = Security.AUTO  # the in-process ps serves on loopback
        return Job(local.config, local.secret, options, local)
    config = resolve_cluster_config(args, environ)
    secret = resolve_job_secret(environ)
    if serve_unless_training(config, secret=secret, security=options.get("security", Security.AUTO),
                             replication=replication_options(flags)):
        raise SystemExit(0)
    return Job(config, secret, options)


def _names_a_cluster(args: argparse.Namespace | None, environ: Mapping[str, str]) -> bool:
    flags = args is not None and any(getattr(args, dest, None) for dest in CLUSTER_FLAG_DESTS)
    return flags or bool(environ.get("TF_CONFIG", "").strip())


def _flags(args: argparse.Namespace | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The training flags in `args` (session and ps-side options: replication), defaults for the rest."""
    parser = argparse.ArgumentParser(add_help=False)
    add_training_flags(parser, environ)
    flags = vars(parser.parse_args([]))
    for name in flags:
        value = getattr(args, name, None)
        if value is not None:
            flags[name] = value
    return argparse.Namespace(**flags)


def _options(args: argparse.Namespace | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """TrainingSession options from the training flags in `args`, defaults for the rest."""
    return session_options(_flags(args, environ))
