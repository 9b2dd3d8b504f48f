"""The GPUs a launcher or agent hands out: the ones its CUDA_VISIBLE_DEVICES names when set
(a shared machine, a Slurm step), else every GPU nvidia-ml-py counts; tasks get those names."""

from pathlib import Path

import pytest

from shoal.cluster import TaskId
from shoal.launch.agent_client import AgentError, Bound, _visible_gpus
from shoal.launch.allocation import take_free_gpus
from shoal.launch.errors import PlanError
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.executor_slurm import _step_gpus
from shoal.launch.plan import added_task, format_plan, make_plan
from shoal.launch.spec import spec_from_dict
from shoal.launch.nvml import GpuIdentity
from shoal.launch.visible_gpus import VisibleGpus, parse_visible_devices, visible_gpus


@pytest.mark.parametrize("value, ids", [
    ("2,3", ("2", "3")),
    (" 1 , 0 ", ("1", "0")),
    ("GPU-8b752099-c817,MIG-1f2e", ("GPU-8b752099-c817", "MIG-1f2e")),
    ("0,-1,2", ("0",)),       # CUDA stops at the first invalid entry
    ("1,,2", ("1",)),
    ("-1", ()),
    ("", ()),
    # as libcuda reads them (checked on an H200): strtoul indexes, junk ends the list
    ("+1,2gpu", ("1", "2")),
    ("none", ()),
    ("NoDevFiles", ()),           # what Slurm sets when a step has no GPU device files
    ("0,none,1", ("0",)),
    ("gpu-8b75", ()),             # UUIDs are case-sensitive
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, ids):
    assert parse_visible_devices(value) == ids


@pytest.mark.parametrize("value, ids", [
    ("0,0", ()),                  # cuInit: CUDA_ERROR_INVALID_DEVICE (an H200)
    ("1, 1", ()),
    ("2,0,0", ()),
    ("0,1,2,1", ()),
    ("GPU-8b75,GPU-8b75", ()),
])
def test_a_name_given_twice_hides_every_gpu_as_in_cuda(value, ids):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}).ids == ids


@pytest.mark.parametrize("value, ids", [
    ("0,1", ("0",)),              # a 1-GPU host: CUDA shows one device, not two
    ("1,0", ()),
    ("0,7,1", ("0",)),
    ("GPU-8b75,3", ("GPU-8b75",)),
])
def test_an_index_past_the_hosts_gpus_ends_the_list_as_in_cuda(value, ids):
    assert parse_visible_devices(value, count=1) == ids


@pytest.fixture(autouse=True)
def host_gpus(monkeypatch):
    """The host's GPU count as NVML tells it (0: NVML cannot tell); 0 unless a test sets it."""
    count = [0]
    monkeypatch.setattr("shoal.launch.visible_gpus.gpu_count", lambda: count[0])
    monkeypatch.setattr("shoal.launch.visible_gpus.gpu_identities",
                        lambda: [GpuIdentity(uuid(i), "NVIDIA H200") for i in range(count[0])])
    return count


def uuid(index: int) -> str:
    return f"GPU-{index:08x}-c817-4e0a-9f1d-5a6b7c8d9e0f"


@pytest.mark.parametrize("value, ids", [
    ("0,GPU-00000000-c817-4e0a-9f1d-5a6b7c8d9e0f", ("0",)),
    ("0,GPU-00000000-c817-4e0a-9f1d-5a6b7c8d9e0f,1", ("0",)),  # named the other way: the list ends there
    ("GPU-00000001-c817-4e0a-9f1d-5a6b7c8d9e0f,1,0", ("GPU-00000001-c817-4e0a-9f1d-5a6b7c8d9e0f",)),
    ("GPU-00000001-c817-4e0a-9f1d-5a6b7c8d9e0f,0,1", ("GPU-00000001-c817-4e0a-9f1d-5a6b7c8d9e0f", "0")),
    ("GPU-00000001,1", ("GPU-00000001",)),   # a unique prefix names the GPU, as in CUDA
    ("MIG-1f2e,0", ("MIG-1f2e", "0")),
    ("0,GPU-ffffffff-0000,1", ("0",)),    # a UUID of no GPU here ends the list, as in CUDA
    ("GPU-0000000,1", ()),                # so does a prefix of two UUIDs
    ("GPU-00000000-c817-4e0a-9f1d-5a6b7c8d9e0f,GPU-00000000", ()),  # a UUID and its prefix: no GPU
    ("0,GPU-00000000-c817-4e0a-9f1d-5a6b7c8d9e0f,GPU-00000000", ("0",)),  # (the list ended before)
    ("GPU-00000001,1,GPU-00000001-c817", ("GPU-00000001",)),
    ("1,GPU-00000000,0,GPU-00000000-c817", ("1", "GPU-00000000")),
    ("GPU-00000001,GPU-00000000", ("GPU-00000001", "GPU-00000000")),  # two GPUs by prefix: both
])
def test_a_gpu_named_by_index_and_by_uuid_ends_the_list_there_and_so_does_an_unknown_uuid(host_gpus, value, ids):
    host_gpus[0] = 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}).ids == ids


H200 = "GPU-45b0bc69-0a7d-98c9-08cc-dfa29d0eca45"
UNKNOWN = "GPU-ffffffff-0000"


@pytest.mark.parametrize("value, cuda", [  # torch.cuda.device_count() on 1-GPU H200s, 2026-11-28
    ("0", 1), (H200, 1), (f"0,{H200}", 1), (f"{H200},0", 1), (H200[:12], 1), (f"{H200[:12]},0", 1),
    (f"0,{H200[:12]}", 1), (f"{H200},{H200[:12]}", 0), (f"{H200[:12]},{H200}", 0), (f"{H200[:8]},{H200[:12]}", 0),
    (f"0,{H200},{H200[:12]}", 1), (f"{H200},0,0", 1), (f"{H200},{UNKNOWN}", 1), (f"0,0,{H200}", 0),
    (f"{H200[:12]},0,{H200}", 1), (f"0,{H200},0", 1), (H200.lower(), 0), ("0,0", 0),
    ("1", 0), ("0,1", 1), (UNKNOWN, 0), (f"0,{UNKNOWN}", 1), (f"{UNKNOWN},0", 0), ("", 0), ("-1", 0), ("none", 0),
    ("NoDevFiles", 0),
])
def test_the_gpus_handed_out_on_a_1_gpu_host_are_as_many_as_cuda_showed_there(monkeypatch, value, cuda):
    gpus_as_nvml_reads_them(monkeypatch, GpuIdentity(H200, "NVIDIA H200"))
    assert len(visible_gpus({"CUDA_VISIBLE_DEVICES": value})) == cuda


def test_two_tasks_are_not_given_one_gpu_named_two_ways(host_gpus):
    host_gpus[0] = 2
    launcher_env = {"CUDA_VISIBLE_DEVICES": f"0,{uuid(0)}"}
    with pytest.raises(PlanError, match=rf"asks for 2 GPUs in all but this host has 1 "
                                        rf"\(CUDA_VISIBLE_DEVICES=0,{uuid(0)}\)"):
        plan_under(launcher_env, {"worker": {"count": 2, "gpus": 1}})


def gpus_as_nvml_reads_them(monkeypatch, *identities):
    monkeypatch.setattr("shoal.launch.visible_gpus.gpu_identities", lambda: list(identities))


def test_on_a_host_of_mixed_models_an_index_is_matched_to_a_uuid_only_in_pci_bus_order(monkeypatch):
    gpus_as_nvml_reads_them(monkeypatch, GpuIdentity(uuid(0), "NVIDIA A100"), GpuIdentity(uuid(1), "NVIDIA H100"))
    value = f"0,{uuid(0)}"  # CUDA's default order may number the H100 0: these may be two GPUs
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}).ids == ("0", uuid(0))
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).ids == ("0",)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": f"{uuid(1)},{uuid(1)[:12]}"}).ids == ()  # in any order: none


def test_a_gpu_nvml_cannot_read_still_counts_and_no_uuid_is_taken_for_unknown(monkeypatch):
    gpus_as_nvml_reads_them(monkeypatch, GpuIdentity(uuid(0), "NVIDIA H200"), GpuIdentity(None, None))
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}).ids == ("0", "1")  # still cut at NVML's count
    other = "GPU-ffffffff-0000"  # perhaps the GPU NVML could not read: kept
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": f"{uuid(0)},{other}"}).ids == (uuid(0), other)


def test_without_nvml_the_names_are_trusted_as_given_and_the_launcher_says_so():
    visible = visible_gpus({"CUDA_VISIBLE_DEVICES": "0,GPU-00000000"})  # (whether GPU 0 is GPU-00000000 needs NVML)
    assert visible.ids == ("0", "GPU-00000000") and visible.unchecked
    said: list[str] = []
    executor = LocalExecutor(python="/py", base_env={"CUDA_VISIBLE_DEVICES": "3"}, notify=said.append)
    executor.allocate(spec_from_dict({"name": "g", "run": "python t.py", "roles": {"worker": {"gpus": 1}}}))
    assert len(said) == 1 and "CUDA_VISIBLE_DEVICES=3 names the GPUs tasks get on this host, unchecked: nvidia-ml-py" in said[0]


def test_gpus_nvml_checked_are_not_called_unchecked(host_gpus):
    host_gpus[0] = 1
    assert not visible_gpus({"CUDA_VISIBLE_DEVICES": "0"}).unchecked
    assert not visible_gpus({"CUDA_VISIBLE_DEVICES": ""}).unchecked and not visible_gpus({}).unchecked


def test_a_job_is_not_given_a_gpu_index_the_host_lacks(host_gpus):
    host_gpus[0] = 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,2,3"}).ids == ("1",)
    with pytest.raises(PlanError, match=r"asks for 2 GPUs in all but this host has 1 \(CUDA_VISIBLE_DEVICES=1,2,3\)"):
        plan_under({"CUDA_VISIBLE_DEVICES": "1,2,3"}, {"worker": {"count": 2, "gpus": 1}})
    with pytest.raises(PlanError, match=r"CUDA_VISIBLE_DEVICES=0,0 leaves no GPU to the job"):
        plan_under({"CUDA_VISIBLE_DEVICES": "0,0"}, {"worker": {"count": 2, "gpus": 1}})


def test_the_environment_chooses_the_gpus_when_it_names_them_else_nvml_counts_them():
    named = VisibleGpus(("2", "3"), "CUDA_VISIBLE_DEVICES=2,3", unchecked=True)  # no NVML here to check them
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == named
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == VisibleGpus((), "CUDA_VISIBLE_DEVICES=")
    assert visible_gpus({}) == VisibleGpus()


def test_without_the_variable_every_gpu_nvml_counts_is_usable(host_gpus):
    host_gpus[0] = 3
    assert visible_gpus({}) == VisibleGpus(("0", "1", "2"))


def plan_under(launcher_env, roles):
    spec = spec_from_dict({"name": "g", "run": "python t.py", "roles": roles})
    allocation = LocalExecutor(python="/py", base_env=launcher_env).allocate(spec)
    return make_plan(spec, allocation, job_id="g-1", shoal_home=Path("/h"), workdir=Path("/w"), secret="s" * 64)


def test_tasks_get_the_gpus_the_launchers_cuda_visible_devices_names_and_the_ps_none():
    plan = plan_under({"CUDA_VISIBLE_DEVICES": "5,GPU-7a"}, {"worker": {"count": 2, "gpus": 1}, "ps": {}})
    envs = {t.name: t.env_dict for t in plan.tasks}
    assert envs["worker.0"]["CUDA_VISIBLE_DEVICES"] == "5"
    assert envs["worker.1"]["CUDA_VISIBLE_DEVICES"] == "GPU-7a"
    assert envs["ps.0"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "worker.1  " in format_plan(plan) and "gpus GPU-7a" in format_plan(plan)  # --dry-run shows them


def test_a_job_asking_for_more_gpus_than_cuda_visible_devices_leaves_is_refused_naming_it():
    with pytest.raises(PlanError, match=r"asks for 2 GPUs in all but this host has 1 \(CUDA_VISIBLE_DEVICES=3\)"):
        plan_under({"CUDA_VISIBLE_DEVICES": "3"}, {"worker": {"count": 2, "gpus": 1}})
    with pytest.raises(PlanError, match=r"CUDA_VISIBLE_DEVICES=-1 leaves no GPU to the job; name the GPUs"):
        plan_under({"CUDA_VISIBLE_DEVICES": "-1"}, {"worker": {"gpus": 1}})


def test_a_job_asking_for_no_gpus_leaves_cuda_visible_devices_as_the_launcher_has_it():
    plan = plan_under({"CUDA_VISIBLE_DEVICES": "3"}, {"worker": {}, "ps": {}})
    assert all("CUDA_VISIBLE_DEVICES" not in t.env_dict for t in plan.tasks)


def test_a_slurm_tasks_gpus_are_the_names_its_agent_step_sees():
    step = Bound((1, 2), VisibleGpus(("4", "6"), "CUDA_VISIBLE_DEVICES=4,6"))  # Slurm confines no devices
    assert _step_gpus((0,), "n1", step) == ("4",) and _step_gpus((1,), "n1", step) == ("6",)
    assert _step_gpus((), "n1", step) == ()
    assert _step_gpus((0, 1), "n1", Bound((0, 0))) == ("0", "1")  # a dry run: no agent asked
    with pytest.raises(PlanError, match=r"n1: its agent step sees 2 GPUs \(CUDA_VISIBLE_DEVICES=4,6\) but its "
                                        r"tasks need at least 3"):
        _step_gpus((2,), "n1", step)


def test_an_agents_gpus_must_be_a_list_of_names():
    assert _visible_gpus({"gpus": ["0", "GPU-a"], "gpus_from": ""}) == VisibleGpus(("0", "GPU-a"))
    for bad in ({"gpus": 2}, {"gpus": "0,1"}, {"gpus": [0]}, {"gpus": ["0"], "gpus_from": 3}):
        with pytest.raises(AgentError, match="the agent's GPUs are not a list of names"):
            _visible_gpus(bad)


def test_tasks_added_to_a_gpu_role_get_the_gpus_no_running_task_holds():
    spec = spec_from_dict({"name": "g", "run": "python t.py", "roles": {"chief": {}, "worker": {"count": "0..3",
                                                                                                "gpus": 1}}})
    executor = LocalExecutor(python="/py", base_env={"CUDA_VISIBLE_DEVICES": "4,5"})
    plan = make_plan(spec, executor.allocate(spec), job_id="g-1", shoal_home=Path("/h"), workdir=Path("/w"),
                     secret="s" * 64)
    assert plan.tasks[0].env_dict["CUDA_VISIBLE_DEVICES"] == ""  # a role that starts empty makes it a GPU host
    running = list(plan.tasks)
    first = executor.place_task(plan, TaskId("worker", 0), running)
    assert first.gpus == ("4",) and first.gpu_host
    running.append(added_task(plan, first, running))
    assert running[-1].env_dict["CUDA_VISIBLE_DEVICES"] == "4"
    second = executor.place_task(plan, TaskId("worker", 1), running)
    assert second.gpus == ("5",)
    with pytest.raises(PlanError, match=r"worker:2 asks for 1 GPU\(s\) but this host has 0 free of 2 \(2 held by "
                                        r"the job's tasks, CUDA_VISIBLE_DEVICES=4,5\)"):
        executor.place_task(plan, TaskId("worker", 2), running + [added_task(plan, second, running)])
    assert executor.place_task(plan, TaskId("worker", 2), running[:1]).gpus == ("4",)  # worker 0 was scaled down


def test_a_gpu_role_that_starts_with_no_task_and_could_never_get_its_gpus_is_refused_at_start():
    """Every `shoal scale` of it would be refused, so the job is, before anything starts."""
    def spec(count, gpus):
        return spec_from_dict({"name": "g", "run": "python t.py", "roles": {"chief": {}, "worker": {"count": count,
                                                                                                     "gpus": gpus}}})
    for executor, why in ((LocalExecutor(python="/py", base_env={"CUDA_VISIBLE_DEVICES": ""}),
                           r"CUDA_VISIBLE_DEVICES= leaves no GPU to the job"),
                          (LocalExecutor(python="/py", gpu_count=0),
                           r"no NVIDIA GPU was found on this host \(nvidia-ml-py missing or reports none\)"),
                          (LocalExecutor(python="/py", base_env={"CUDA_VISIBLE_DEVICES": "3"}),
                           r"this host has 1 GPU\(s\) \(CUDA_VISIBLE_DEVICES=3\)")):
        with pytest.raises(PlanError, match=r"^roles.worker \(count: 0..3, gpus: 2\) starts with no task, and every "
                                            r"`shoal scale` of it would be refused: " + why + "; lower its gpus"):
            executor.allocate(spec("0..3", 2))
    assert LocalExecutor(python="/py", gpu_count=0).allocate(spec(0, 1)).tasks  # count 0, no range: it never grows
    assert LocalExecutor(python="/py", gpu_count=2).allocate(spec("0..3", 2)).tasks  # one task at a time fits


def test_a_task_added_to_a_gpu_role_on_a_host_with_no_gpu_for_the_job_is_refused_saying_why():
    """(An ssh host of the job with no GPU.) Scaling down frees nothing there: the refusal
    names what leaves the host no GPU."""
    for gpus, why in ((VisibleGpus((), "CUDA_VISIBLE_DEVICES="), r"CUDA_VISIBLE_DEVICES= leaves it none"),
                      (VisibleGpus(), r"no NVIDIA GPU was found")):
        with pytest.raises(PlanError, match=r"worker:0 asks for 1 GPU\(s\) but h2 has no GPU for the job \("
                                            + why) as refused:
            take_free_gpus(1, gpus, (), TaskId("worker", 0), "h2")
        assert "scale a role" not in str(refused.value)
