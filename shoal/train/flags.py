"""Command-line flags of a training program, shared by the examples and meant for yours:
`add_training_flags(parser, environ)`, `session_options(args)` for TrainingSession and
`wire_security(args)` and `replication_options(args)` for the ps side
(`serve_unless_training(..., security=..., replication=...)`).

Pure argparse: the caller passes the environment in (for `--model_dir`'s default, $OUTPUT_DIR,
which the launcher sets).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from shoal.ps.replicator import ReplicationOptions
from shoal.ps.membership import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from shoal.train.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_S
from shoal.train.options import CheckpointOptions, SyncOptions
from shoal.train.placement import PlacementStrategy
from shoal.train.part_size import LINK_PART_BYTES, LOOPBACK_PART_BYTES, PartSize
from shoal.wire.security import Security


def add_training_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Add --sync, --replicas_to_aggregate, --steps, --model_dir, --log_every, the
    checkpoint, replication and recovery flags, --heartbeat_timeout, --push_part_bytes, --ps_placement,
    --overlap_push, --wire_security and --wire_shared_memory."""
    mode = parser.add_mutually_exclusive_group()  # (--overlap_push is for asynchronous training)
    mode.add_argument("--sync", action="store_true", help="synchronous training (default: asynchronous)")
    parser.add_argument("--replicas_to_aggregate", type=int, default=None,
                        help="with --sync: gradients per step (default: all workers; fewer = backup workers)")
    parser.add_argument("--steps", type=int, default=1000, help="global steps to train (default: 1000)")
    parser.add_argument("--model_dir", default=environ.get("OUTPUT_DIR"),
                        help="model directory shared by the job (default: $OUTPUT_DIR)")
    parser.add_argument("--log_every", type=int, default=100, help="print progress every N local steps")
    parser.add_argument("--checkpoint_every_steps", type=int, default=0,
                        help="with --model_dir: also save a checkpoint every N global steps (default 0: off)")
    parser.add_argument("--checkpoint_every_secs", type=float, default=60,
                        help="with --model_dir: save a checkpoint every N seconds (default 60; 0: off). The chief "
                             "also saves at the end and when stopped by SIGTERM (shoal kill, a deadline, preemption)")
    parser.add_argument("--keep_checkpoints", type=int, default=5,
                        help="with --model_dir: how many of the newest checkpoints to keep (default 5)")
    parser.add_argument("--ps_recovery_timeout", type=float, default=120,
                        help="seconds to wait for a lost ps task to come back before failing (or re-homing it) "
                             "(default 120)")
    parser.add_argument("--lost_ps", choices=("rehome", "fail"), default="rehome",
                        help="a lost ps (other than ps 0) that does not come back within --ps_recovery_timeout: "
                             "rehome (default) moves its shards to the other ps tasks (from its replica, else the "
                             "checkpoint) and trains on with one ps fewer; fail ends the job (every worker must say "
                             "the same; see docs/checkpoints.md). Between-graph training only: in-graph (a "
                             "coordinator) does not re-home")
    parser.add_argument("--replicate_every_secs", type=float, default=0,
                        help="ps tasks: send a copy of the shards (values, optimizer state, step) to the next ps "
                             "every N seconds, so a ps that dies and is restarted is rebuilt from it, losing at most "
                             "about N seconds of updates instead of everything since the last checkpoint (default "
                             "0: off; see docs/checkpoints.md)")
    parser.add_argument("--replicate_every_steps", type=int, default=0,
                        help="ps tasks: also replicate every N steps of the ps (default 0: off)")
    parser.add_argument("--heartbeat_timeout", type=_heartbeat_timeout, default=DEFAULT_HEARTBEAT_TIMEOUT_S,
                        help="seconds without a heartbeat after which the ps drop this replica from the job's "
                             "membership: a sync step then completes without it (default: "
                             f"{DEFAULT_HEARTBEAT_TIMEOUT_S:g})")
    parser.add_argument("--push_part_bytes", type=int, default=None,
                        help="send a push in parts of about this many bytes, so the upload of one part overlaps "
                             f"the download of the one before (default: {LOOPBACK_PART_BYTES} when every ps is on "
                             f"loopback, else {LINK_PART_BYTES}; 0: one message per ps)")
    parser.add_argument("--ps_placement", choices=[p.value for p in PlacementStrategy],
                        default=PlacementStrategy.GREEDY.value,
                        help="how variables are put on the ps tasks (every task of the job must say the same): "
                             "greedy (default) = largest first, by bytes, small ones with others (one request per "
                             "ps they use per step); round_robin = in the order given, ps 0, 1, 2, ... (TF's "
                             "replica_device_setter)")
    mode.add_argument("--overlap_push", action="store_true",
                        help="asynchronous training: send each gradient and compute the next while the ps applies "
                             "it (each gradient one step staler; shoal/train/push_overlap.py). Not with --sync")
    parser.add_argument("--wire_security", choices=[s.value for s in Security], default=Security.AUTO.value,
                        help="how tasks authenticate to the ps (every task of the job must say the same): auto "
                             "(default) = plain on loopback, curve (encrypted) between hosts; plain = never "
                             "encrypted, for a network you trust; curve = always")
    parser.add_argument("--wire_shared_memory", choices=("auto", "off"), default="auto",
                        help="auto (default): pushes to a ps on this machine (loopback, or one of its own "
                             "addresses) carry their tensors through shared memory instead of the socket (the ps "
                             "must accept it, else the socket); off: always the socket")


def _heartbeat_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from {MIN_TIMEOUT_S:g} to "
                                         f"{MAX_TIMEOUT_S:g}")
    return value


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    """TrainingSession keyword arguments from the flags `add_training_flags` added."""
    return dict(sync=SyncOptions(args.replicas_to_aggregate) if args.sync else False,
                max_steps=args.steps, model_dir=args.model_dir or None, summary_every_steps=args.log_every,
                checkpoints=CheckpointOptions(every_steps=args.checkpoint_every_steps or None,
                                              every_s=args.checkpoint_every_secs or None,
                                              keep=args.keep_checkpoints),
                ps_recovery_timeout_s=args.ps_recovery_timeout, security=wire_security(args),
                push_part_bytes=PartSize.AUTO if args.push_part_bytes is None else args.push_part_bytes or None,
                heartbeat_timeout_s=args.heartbeat_timeout, rehome_lost_ps=args.lost_ps == "rehome",
                shared_memory=args.wire_shared_memory == "auto", placement=PlacementStrategy(args.ps_placement),
                overlap_push=args.overlap_push)


def replication_options(args: argparse.Namespace) -> ReplicationOptions:
    """The shard replication `--replicate_every_secs` / `--replicate_every_steps` chose (0 is
    off): pass it to `serve_unless_training` (or `Server`)."""
    return ReplicationOptions(every_s=args.replicate_every_secs or None, every_steps=args.replicate_every_steps or None)


def wire_security(args: argparse.Namespace) -> Security:
    """The wire security `--wire_security` chose: pass it to `serve_unless_training` (or
    `Server`); `session_options` already holds it for the TrainingSession."""
    return Security(args.wire_security)
