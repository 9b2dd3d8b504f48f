"""Plans: addresses, TF_CONFIG, environment per task, GPUs, and the dry-run text."""

import json
import shlex
from pathlib import Path

import pytest

from shoal.cluster import parse_tf_config
from shoal.launch.errors import PlanError
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.plan import HIDDEN_SECRET, format_plan, make_plan
from shoal.launch.spec import spec_from_dict


def plan_of(roles, gpu_count=0, **extra):
    spec = spec_from_dict({"name": "m", "run": "python t.py --lr 0.1", "roles": roles, **extra})
    allocation = LocalExecutor(python="/py", gpu_count=gpu_count).allocate(spec)
    return make_plan(spec, allocation, job_id="m-1", shoal_home=Path("/h"), workdir=Path("/w"),
                     secret="s" * 64)


def test_plan_gives_each_task_a_distinct_loopback_address_and_its_tf_config():
    plan = plan_of({"chief": {}, "worker": {"count": 2}, "ps": {"count": 2}})
    assert [t.name for t in plan.tasks] == ["ps.0", "ps.1", "chief.0", "worker.0", "worker.1"]
    addresses = [t.address for t in plan.tasks]
    assert len(set(addresses)) == 5 and all(a.startswith("127.0.0.1:") for a in addresses)
    for task in plan.tasks:
        config = parse_tf_config(task.env_dict["TF_CONFIG"])
        assert config.task == task.task
        assert config.cluster.task_address(task.task.job, task.task.index) == task.address
    assert plan.primary.job == "chief"


def test_plan_sets_job_and_torch_style_environment():
    plan = plan_of({"worker": {"count": 2}, "ps": {"count": 1}})
    envs = {t.name: t.env_dict for t in plan.tasks}
    for env in envs.values():
        assert env["SHOAL_JOB_SECRET"] == "s" * 64 and env["OUTPUT_DIR"] == "/h/jobs/m-1/model"
        assert env["SHOAL_JOB_NAME"] == "m" and env["PYTHONUNBUFFERED"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["WORLD_SIZE"] == "2"
    assert envs["worker.1"]["RANK"] == "1" and envs["worker.1"]["SHOAL_TASK"] == "worker:1"
    assert "RANK" not in envs["ps.0"]
    master_port = envs["ps.0"]["MASTER_PORT"]
    assert all(not t.address.endswith(":" + master_port) for t in plan.tasks)


def test_plan_runs_python_commands_under_the_launchers_python():
    plan = plan_of({"worker": {}})
    assert plan.tasks[0].argv == ("/py", "t.py", "--lr", "0.1")


def test_spec_and_role_env_override_launcher_env():
    plan = plan_of({"worker": {"env": {"A": "role"}, "cpus": 2}}, env={"A": "job", "B": "job"})
    env = plan.tasks[0].env_dict
    assert env["A"] == "role" and env["B"] == "job" and env["OMP_NUM_THREADS"] == "2"


def test_gpus_requested_without_gpus_is_a_plan_error():
    with pytest.raises(PlanError, match="no NVIDIA GPU was found"):
        plan_of({"worker": {"gpus": 1}})


def test_gpus_are_assigned_distinct_devices_and_ps_gets_none():
    plan = plan_of({"worker": {"count": 2, "gpus": 2}, "ps": {}}, gpu_count=4)
    envs = {t.name: t.env_dict for t in plan.tasks}
    assert envs["worker.0"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert envs["worker.1"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert envs["ps.0"]["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(PlanError, match="asks for 4 GPUs in all but this host has 3"):
        plan_of({"worker": {"count": 2, "gpus": 2}}, gpu_count=3)


def test_dry_run_text_has_one_runnable_line_per_task():
    plan = plan_of({"worker": {"count": 2}, "ps": {"count": 1}})
    text = format_plan(plan)
    commands = [line for line in text.splitlines() if line.startswith("cd ")]
    assert len(commands) == 3
    words = shlex.split(commands[2])
    assert words[:4] == ["cd", "/w", "&&", "env"] and words[-4:] == ["/py", "t.py", "--lr", "0.1"]
    env = dict(w.split("=", 1) for w in words[4:-4])
    assert env == {**plan.tasks[2].env_dict, "SHOAL_JOB_SECRET": HIDDEN_SECRET}
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
