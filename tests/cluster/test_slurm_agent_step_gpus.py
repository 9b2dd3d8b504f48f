"""A Slurm node's lost agent step, replaced by a new one (executor_slurm._replace_agent), with a
real agent process standing in for the step's: when the new step holds other GPUs than the
tasks of the node were given (Slurm confines no devices), the restart waits — the new step is
ended, and HostUnreachableError says which GPUs — instead of starting a task on a GPU its step
does not hold; with the same GPUs the new agent is installed. The GPUs are named as MIG
instances, names no host checks against its own GPUs (an index or a GPU UUID it lacks would read
as no GPU on a GPU host)."""

import os
import sys

import pytest

from shoal.cluster import TaskId
from shoal.launch.agent_client import AgentConnection
from shoal.launch.errors import HostUnreachableError
from shoal.launch.executor_slurm import SlurmExecutor
from shoal.launch.plan import TaskPlan
from shoal.launch.slurm import SlurmJob

pytestmark = pytest.mark.timeout(60)


class RunningJob:
    """The few Slurm commands `_replace_agent` runs, for a job that runs on."""

    def __init__(self) -> None:
        self.cancelled: list[list[str]] = []

    def state(self, job_id: str) -> str:
        return "RUNNING"

    def cancel(self, steps: list[str]) -> None:
        self.cancelled.append(list(steps))


def executor_whose_new_step_sees(gpus: str, made: list, step: tuple = ()) -> tuple[SlurmExecutor, RunningJob]:
    """`step`: SLURM_JOB_ID and SLURM_STEP_ID for the new agent, as srun sets them (its hello
    then names the step); none for a step that is installed (no Slurm watchdog is started)."""
    commands = RunningJob()
    executor = SlurmExecutor(commands=commands, python=sys.executable, base_env=dict(os.environ))
    executor._job = SlurmJob("7", ())
    executor._gpus["n1"], executor._gpu_names["n1"] = 1, (GIVEN,)  # its tasks were given this GPU

    def new_step(job, node):
        made.append(AgentConnection([sys.executable, "-m", "shoal.launch.agent"], node, "slurm",
                                    env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus, **dict(step)}))
        return made[-1]
    executor._connection = new_step
    return executor, commands


@pytest.fixture
def made():
    agents: list[AgentConnection] = []
    yield agents
    for agent in agents:
        agent.close(grace=0.5, timeout=5)


GIVEN, OTHER = "MIG-00000000-0000-4000-8000-000000000002", "MIG-00000000-0000-4000-8000-000000000003"
TASK = TaskPlan(TaskId("worker", 0), "n1.worker.0", "10.0.0.1:2222", ("true",), (), "/dev/null", (GIVEN,), "n1")


def test_a_new_agent_step_holding_other_gpus_is_ended_and_the_restart_waits(made):
    executor, commands = executor_whose_new_step_sees(OTHER, made, (("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "4")))
    with pytest.raises(HostUnreachableError, match=f"not yet: its new agent step holds the GPUs {OTHER} where its tasks"
                                                   f" were given {GIVEN} \\(CUDA_VISIBLE_DEVICES={OTHER}\\)"):
        executor._replace_agent("n1", TASK)
    assert made[0].returncode is not None  # the new step's agent was stopped
    assert "n1" not in executor._agents and commands.cancelled == [["7.4"]]  # the new step, scancelled
    assert "n1" not in executor._steps


def test_a_new_agent_step_holding_the_same_gpus_is_installed(made):
    executor, commands = executor_whose_new_step_sees(GIVEN, made)
    executor._replace_agent("n1", TASK)
    assert executor._agents["n1"] is made[0] and not commands.cancelled
