"""`serve_unless_training`: the part of "every task runs the same program" that is not
training: a ps task serves its shards until the job is over."""

from __future__ import annotations

import logging

from shoal.cluster import ClusterConfig
from shoal.ps.replicator import ReplicationOptions
from shoal.ps.server import Server
from shoal.wire import JobSecret, Security

log = logging.getLogger(__name__)


def serve_unless_training(config: ClusterConfig, *, secret: JobSecret, security: Security = Security.AUTO,
                          replication: ReplicationOptions = ReplicationOptions()) -> bool:
    """If this task does not train, do its job and return True (the program should then exit):
    a ps serves until every replica is done (blocks for the whole job), replicating its shards
    to the next ps as `replication` says (`shoal.replication_options(args)`; default off); an
    evaluator has nothing to do here (programs with an evaluation loop handle it before calling
    this). A chief or worker returns False at once."""
    if config.task.job == "ps":
        server = Server.for_task(config, secret=secret, security=security, replication=replication)
        server.join()
        log.info("%s done: %s", config.task, server.reason)
        return True
    if config.task.job == "evaluator":
        log.info("%s: this program has no evaluator loop; nothing to do", config.task)
        return True
    return False
