"""`serve_unless_training`: the part of "every task runs the same program" that is not
training: a ps task serves its shards until the job is over."""

from __future__ import annotations

import logging
import signal
import threading

import shoal.sigterm as sigterm
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
    this). A chief or worker returns False at once.

    A ps whose job is over stays a success while its process exits (Python's exit takes ~0.1 s):
    from the end of the job on, SIGTERM is ignored on the main thread, so a launcher stopping
    the ps tasks the moment the workers succeeded does not turn that into a kill; its SIGKILL
    after the grace period still ends a process that would not exit."""
    if config.task.job == "ps":
        server = Server.for_task(config, secret=secret, security=security, replication=replication)
        sigterm.acquire()  # held past join()'s own release, until SIGTERM is ignored
        try:
            server.join()
            _ignore_sigterm_from_now_on()
        finally:
            sigterm.release()  # puts the default action back only if join() raised
        log.info("%s done: %s", config.task, server.reason)
        return True
    if config.task.job == "evaluator":
        log.info("%s: this program has no evaluator loop; nothing to do", config.task)
        return True
    return False


def _ignore_sigterm_from_now_on() -> None:
    """SIG_IGN, which Python's exit keeps (unlike a Python handler, reset to the default action
    as the interpreter finalizes). Only the main thread may set handlers."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
