"""The Slurm executor's pure parts: what Slurm's commands print, parsed; the srun and sbatch
command lines; GPU placement per node; the probe (the agent's one-shot usage report) and its
checks; the executor choice and `--slurm --dry-run` in-process (it runs no Slurm command). The
executor against a real Slurm: tests/multihost."""

import argparse
import io
import os
import re

import psutil
import pytest

from shoal.cli.environment import Environment
from shoal.cli.executors import executor_for
from shoal.cli.main import main
from shoal.cluster import TaskId
from shoal.launch.errors import PlanError
from shoal.launch.executor_slurm import _assign_gpus, _check_pinned_nodes
from shoal.launch.executor import TaskRef
from shoal.launch.job_processes import JobProcess, measure
from shoal.launch.job_scan import HostScan, find_args, read_report, task_usage
from shoal.launch.slurm import (SlurmError, SlurmJob, SlurmNode, agent_step_argv, check_step_id, count_ids,
                                gres_gpus, job_id_from_environ, parse_job_detail, parse_node_addresses,
                                probe_step_argv, step_environment)
from shoal.launch.slurm_submit import sbatch_argv
from shoal.launch.spec import spec_from_dict

DETAIL = ("JobId=42 JobName=shoal-mnist UserId=root(0) JobState=RUNNING Reason=None NodeList=n[1-3] "
          "NumNodes=3 NumCPUs=6   Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:0-1)   "
          "Nodes=n3 CPU_IDs=0,2-3 Mem=0 GRES= MinCPUsNode=1 Command=(null)")


def spec(**roles):
    return spec_from_dict({"name": "j", "run": "python t.py", "roles": roles})


def test_job_detail_gives_each_node_groups_cpus_and_gpus():
    detail = parse_job_detail(DETAIL, "42")
    assert detail.state == "RUNNING"
    assert detail.node_groups == (("n[1-2]", 2, 2), ("n3", 3, 0))


def test_job_detail_names_a_heterogeneous_jobs_components_and_a_plain_job_none():
    het = ("JobId=1 HetJobId=1 HetJobOffset=0 JobName=no-shell HetJobIdSet=1-2 JobState=RUNNING Nodes=n1 CPU_IDs=0 "
           "Mem=0 GRES=\nJobId=2 HetJobId=1 HetJobOffset=1 JobName=no-shell HetJobIdSet=1-2 JobState=RUNNING "
           "Nodes=n2 CPU_IDs=0 Mem=0 GRES=")
    assert parse_job_detail(het, "1").het_job_ids == "1-2"
    assert parse_job_detail(DETAIL, "42").het_job_ids == ""


def test_job_detail_of_another_job_is_refused():
    with pytest.raises(SlurmError, match="does not describe job 7"):
        parse_job_detail(DETAIL, "7")


def test_id_lists_and_gres_count():
    assert count_ids("0-1,4") == 3 and count_ids("") == 0
    assert gres_gpus("gpu:2(IDX:0-1)") == 2 and gres_gpus("nic:1,gpu:v100:1(IDX:3)") == 1 and gres_gpus("") == 0
    with pytest.raises(SlurmError):
        count_ids("a-b")


def test_node_addresses_come_from_nodeaddr():
    text = "NodeName=n1 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=c1\nNodeName=n2 NodeAddr=n2 Port=1\n"
    assert parse_node_addresses(text) == {"n1": "10.0.0.7", "n2": "n2"}


def test_slurm_job_id_from_environ_is_checked():
    assert job_id_from_environ({}) is None
    assert job_id_from_environ({"SLURM_JOB_ID": "123"}) == "123"
    with pytest.raises(SlurmError, match="SLURM_JOB_ID='12; rm'"):
        job_id_from_environ({"SLURM_JOB_ID": "12; rm"})


def test_step_ids_from_records_must_be_ids_before_they_reach_scancel():
    assert check_step_id("12.3") == "12.3" and check_step_id("12") == "12"
    for bad in ("12.batch", "-12", "12 13", ""):
        with pytest.raises(SlurmError):
            check_step_id(bad)


def test_agent_step_asks_for_the_nodes_cpus_and_gpus_and_never_waits_for_other_steps():
    job = SlurmJob("42", (SlurmNode("n1", "10.0.0.7", cpus=8, gpus=2),))
    argv = agent_step_argv(job, job.nodes[0], "/venv/bin/python", gpus=2)
    assert argv[:5] == ["srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n1"]
    assert {"--overlap", "--cpus-per-task=8", "--gres=gpu:2"} <= set(argv) and "--exact" not in argv
    assert argv[-3:] == ["/venv/bin/python", "-m", "shoal.launch.agent"]


def test_srun_outside_the_allocation_drops_other_jobs_variables_but_keeps_slurm_conf():
    base = {"SLURM_CONF": "/etc/s.conf", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "PATH": "/bin"}
    assert step_environment(base, inside=False) == {"SLURM_CONF": "/etc/s.conf", "PATH": "/bin"}
    assert step_environment(base, inside=True) == base


def test_sbatch_sizes_every_slot_for_the_largest_role_and_bounds_the_time():
    job = spec_from_dict({"name": "big", "run": "python t.py", "deadline": "10m", "grace_period": "5s",
                          "env": {"TOKEN": "do-not-submit"},
                          "roles": {"ps": {"count": 2, "memory": "1GiB"},
                                    "worker": {"count": 3, "cpus": 1.5, "memory": "4GiB", "gpus": 1}}})
    argv = sbatch_argv(job, "shoal-big-0a1b2c3d")
    assert argv[:3] == ["sbatch", "--parsable", "--job-name=shoal-big-0a1b2c3d"]
    assert {"--ntasks=5", "--cpus-per-task=2", "--mem-per-cpu=2048M", "--gpus-per-task=1", "--time=13"} <= set(argv)
    assert argv[-1] == "--wrap=exec sleep infinity"
    assert "do-not-submit" not in " ".join(argv)


def test_sbatch_without_resources_asks_one_cpu_per_task_and_no_time_limit():
    argv = sbatch_argv(spec(worker={"count": 2}), "shoal-j-0a1b2c3d")
    assert "--ntasks=2" in argv and "--cpus-per-task=1" in argv
    assert not [a for a in argv if a.startswith(("--mem", "--gpus", "--time"))]


def test_sbatch_asks_for_the_nodes_roles_pin_tasks_to():
    argv = sbatch_argv(spec(ps={"count": 2, "hosts": ["n3", "n1"]}, worker={"count": 2, "hosts": ["n1"]}),
                       "shoal-j-0a1b2c3d")
    assert "--nodelist=n1,n3" in argv and argv[-1] == "--wrap=exec sleep infinity"
    assert not [a for a in sbatch_argv(spec(worker={"count": 2}), "shoal-j-0a1b2c3d") if a.startswith("--nodelist")]
    with pytest.raises(PlanError, match=r"hosts: name 3 nodes \(n1, n2, n3\) for 2 tasks; .* name at most 2"):
        sbatch_argv(spec(ps={"count": 1, "hosts": ["n1", "n2", "n3"]}, worker={"count": 1}), "shoal-j-0a1b2c3d")


def test_gpus_are_numbered_per_node_and_a_node_with_too_few_is_named():
    job = spec(ps={"count": 1}, worker={"count": 3, "gpus": 1})
    ids = [TaskId("ps", 0)] + [TaskId("worker", i) for i in range(3)]
    nodes = {"n1": SlurmNode("n1", "n1", gpus=2), "n2": SlurmNode("n2", "n2", gpus=1)}
    node_of = {ids[0]: "n1", ids[1]: "n2", ids[2]: "n1", ids[3]: "n1"}
    assert _assign_gpus(job, ids, node_of, nodes) == {ids[0]: (), ids[1]: (0,), ids[2]: (0,), ids[3]: (1,)}
    node_of[ids[1]] = "n1"
    with pytest.raises(PlanError, match=r"too few GPUs: on n1, worker.0, worker.1, worker.2 ask for 3 GPUs"
                                        r" and the job holds 2 there; ask Slurm for more"):
        _assign_gpus(job, ids, node_of, nodes)


def test_every_node_with_too_few_gpus_is_named_at_once():
    job = spec(worker={"count": 2, "gpus": 1})
    ids = [TaskId("worker", 0), TaskId("worker", 1)]
    nodes = {"n1": SlurmNode("n1", "n1", gpus=0), "n2": SlurmNode("n2", "n2", gpus=0)}
    with pytest.raises(PlanError, match=r"on n1, worker.0 asks for 1 GPU and the job holds 0 there; on n2, worker.1"
                                        r" asks for 1 GPU and the job holds 0 there;"):
        _assign_gpus(job, ids, {ids[0]: "n1", ids[1]: "n2"}, nodes)


def test_a_role_pinned_to_a_node_outside_the_slurm_job_names_its_nodes():
    job = SlurmJob("7", (SlurmNode("n1", "n1"), SlurmNode("n2", "n2")), submitted=False)
    with pytest.raises(PlanError, match=r"roles.ps.hosts names 'n9', which Slurm job 7 does not hold \(its nodes:"
                                        r" n1, n2\); name nodes of the job"):
        _check_pinned_nodes({"ps": ["n9"]}, job)
    _check_pinned_nodes({"ps": ["n2"]}, job)


def test_probe_step_runs_the_agents_one_shot_usage_for_the_shoal_job():
    argv = probe_step_argv("42", "n2", "/venv/bin/python", find_args("mnist-20260101-abcd", usage=0.5))
    assert argv[:5] == ["srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n2"] and "--overlap" in argv
    assert argv[-7:] == ["/venv/bin/python", "-m", "shoal.launch.agent", "--find", "mnist-20260101-abcd",
                         "--usage", "0.5"]


def test_probe_measures_a_live_process_and_skips_a_reused_pid():
    me = psutil.Process(os.getpid())
    started = me.create_time()
    found = JobProcess(me.pid, os.getpgid(me.pid), started, "worker:0", "python")
    scan = HostScan("n1", processes=tuple(measure([found], 0.05)), mem_total=psutil.virtual_memory().total)
    usage = task_usage(scan, TaskRef("slurm", pid=me.pid, started=started, host="n1"))
    assert usage is not None and usage.mem_used > 0 and usage.mem_total > usage.mem_used
    assert task_usage(scan, TaskRef("slurm", pid=me.pid, started=started - 1000.0, host="n1")) is None


def test_probe_report_is_checked_and_a_damaged_one_names_the_node():
    good = b'login banner\n{"processes": [{"pid": 12, "pgid": 12, "started": 1.5, "task": "ps:0", "command": "p",' \
           b' "cpu": 3.0, "rss": 4096}], "mem_total": 8192, "gpus": null}\n'
    scan = read_report("n1", good)
    assert scan is not None and not scan.error and scan.processes[0].rss == 4096 and scan.mem_total == 8192
    assert read_report("n1", b"no report here\n[]\n") is None
    for bad in (b'{"processes": [{"pid": "x"}]}', b'{"processes": ["12"]}', b'{"processes": [], "gpus": [[1, 2]]}',
                b'{"processes": [], "mem_total": "lots"}'):
        damaged = read_report("n1", bad)
        assert damaged is not None and damaged.error.startswith("n1: the agent's report is damaged")
        assert task_usage(damaged, TaskRef("slurm", pid=12, started=1.5, host="n1")) is None


def test_slurm_flag_dry_run_prints_the_sbatch_command_and_runs_nothing(tmp_path):
    (tmp_path / "job.yaml").write_text("name: j\nrun: python t.py\nroles:\n  ps: {count: 1}\n"
                                       "  worker: {count: 2, cpus: 2}\n")
    out, err = io.StringIO(), io.StringIO()
    # no Slurm command on PATH: any the dry run tried to run would fail it
    env = Environment(environ={"SHOAL_HOME": str(tmp_path / "home"), "PATH": "/nonexistent"}, stdout=out,
                      stderr=err, stdout_bytes=io.BytesIO(), cwd=tmp_path)
    assert main(["train", "job.yaml", "--slurm", "--dry-run"], env) == 0, err.getvalue()
    text = out.getvalue()
    assert text.startswith("# submitted with: sbatch --parsable --job-name=shoal-j-TAG --ntasks=3 --cpus-per-task=2")
    # a `cd` command each (not "cd " inside a job id that happens to end in "cd", as 1 in 256 do)
    assert "# on NODE: ps.0, worker.0, worker.1" in text and len(re.findall(r"(?:^|\s)cd ", text)) == 3
    assert not (tmp_path / "home" / "jobs.db").exists()


def test_a_bad_slurm_job_id_in_the_environment_is_an_error_not_a_local_run(tmp_path):
    (tmp_path / "job.yaml").write_text("name: j\nrun: python t.py\nroles:\n  worker: {count: 1}\n")
    out, err = io.StringIO(), io.StringIO()
    env = Environment(environ={"SHOAL_HOME": str(tmp_path / "home"), "SLURM_JOB_ID": "abc"}, stdout=out,
                      stderr=err, stdout_bytes=io.BytesIO(), cwd=tmp_path)
    assert main(["train", "job.yaml", "--dry-run"], env) == 6
    assert "SLURM_JOB_ID='abc' is not a Slurm job id" in err.getvalue()


def slurm_env(tmp_path, **environ):
    # no Slurm command on PATH: any that a dry run tried to run would fail it
    return Environment(environ={"SHOAL_HOME": str(tmp_path / "home"), "PATH": "/nonexistent", **environ},
                       stdout=io.StringIO(), stderr=io.StringIO(), stdout_bytes=io.BytesIO(), cwd=tmp_path)


def test_inside_an_allocation_or_with_slurm_flag_the_job_runs_on_slurm_before_any_hosts_row(tmp_path):
    job = spec(worker={"count": 1})
    plain = argparse.Namespace(hosts=None, hostfile=None, ssh_config=None, slurm=False, dry_run=True)
    assert executor_for(job, plain, slurm_env(tmp_path, SLURM_JOB_ID="42")).kind == "slurm"
    assert executor_for(job, argparse.Namespace(**{**vars(plain), "slurm": True}), slurm_env(tmp_path)).kind == "slurm"
    assert executor_for(job, plain, slurm_env(tmp_path)).kind == "local"


def test_ssh_hosts_inside_an_allocation_are_refused_saying_what_to_drop(tmp_path):
    (tmp_path / "job.yaml").write_text("name: j\nrun: python t.py\nroles:\n  worker: {count: 1}\n")
    env = slurm_env(tmp_path, SLURM_JOB_ID="42")
    assert main(["train", "job.yaml", "--hosts", "node1,node2", "--dry-run"], env) == 4
    err = env.stderr.getvalue()
    assert "inside Slurm job 42" in err and "--hosts names node1, node2" in err
    assert "to run on Slurm, drop --hosts" in err and "env -u SLURM_JOB_ID" in err


def test_spec_hosts_under_slurm_are_refused_and_a_roles_hosts_are_not(tmp_path):
    (tmp_path / "job.yaml").write_text("name: j\nrun: python t.py\nhosts: [node1]\nroles:\n  worker: {count: 1}\n")
    env = slurm_env(tmp_path)
    assert main(["train", "job.yaml", "--slurm", "--dry-run"], env) == 4
    err = env.stderr.getvalue()
    assert "the spec lists hosts: (node1)" in err and "remove the spec's top-level hosts:" in err
    assert "to run them over ssh, drop --slurm" in err
    (tmp_path / "job.yaml").write_text("name: j\nrun: python t.py\nroles:\n  worker: {count: 1, hosts: [NODE]}\n")
    env = slurm_env(tmp_path)
    assert main(["train", "job.yaml", "--slurm", "--dry-run"], env) == 0, env.stderr.getvalue()


def test_slurm_flag_beside_hosts_flag_is_a_usage_error(tmp_path):
    env = slurm_env(tmp_path)
    assert main(["run", "--slurm", "--hosts", "a", "--dry-run", "--", "python", "t.py"], env) == 2
