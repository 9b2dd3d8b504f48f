"""bench/multihost's pure parts: the schedule, the figures of one run (window, busiest link, link
bound, CPU by role), the ratios within rounds, and the report."""

import os
import subprocess

import pytest

from bench.jobrun import Task
from bench.multihost import plan, report
from bench.multihost.runs import Config, System, measure, progress, shoal_argv, steps_for, Where
from bench.multihost.sampler import Sampled


def test_matrix_holds_every_system_per_link_and_loopback_once():
    configs = plan.matrix(["mlp"], ["async", "sync"], ["1ps+2w"], ["1gbit", "unshaped"], ["1gbit"], [2])
    keys = [c.key for c in configs]
    assert "shoal-ssh mlp sync 1ps+2w 1gbit plain" in keys and "shoal-ssh mlp sync 1ps+2w unshaped plain" not in keys
    assert keys.count("ddp mlp sync 2w 1gbit -") == 1 and keys.count("ddp mlp sync 2w unshaped -") == 1
    assert [c.link for c in configs].count("loopback") == 2 and len(keys) == len(set(keys)) == 10


def test_rounds_rotate_the_link_groups_and_the_runs_inside_each_group():
    configs = plan.matrix(["softmax"], ["async", "sync"], ["1ps+2w"], ["1gbit", "10gbit"], [], [])
    first, second = plan.rounds(configs, 2)
    assert sorted(c.key for c in first) == sorted(c.key for c in second)
    assert [c.link for c in first][:2] == ["1gbit"] * 2 and [c.link for c in second][:2] == ["10gbit"] * 2
    assert first[0].mode == "async" and second[0].mode == "sync"


def test_parse_shape_rejects_what_is_not_ps_plus_workers():
    assert plan.parse_shape("2ps+4w") == (2, 4, False)
    assert plan.parse_shape("2ps+2w/colocated") == (2, 2, True)
    with pytest.raises(ValueError, match="not like 1ps\\+2w"):
        plan.parse_shape("2+4")
    with pytest.raises(ValueError, match="as many ps as workers"):
        plan.parse_shape("1ps+2w/colocated")


def test_a_colocated_shape_shares_the_loopback_run_of_its_plain_shape():
    configs = plan.matrix(["mlp"], ["sync"], ["2ps+2w", "2ps+2w/colocated"], ["1gbit"], [], [2])
    keys = [c.key for c in configs]
    assert "shoal-ssh mlp sync 2ps+2w/colocated 1gbit curve" in keys
    assert keys.count("shoal-local mlp sync 2ps+2w loopback plain") == 1 and len(keys) == 4


def test_a_colocated_shape_runs_on_as_many_hosts_as_workers():
    configs = plan.matrix(["mlp"], ["sync"], ["2ps+2w/colocated"], ["1gbit"], [], [])
    colocated = next(c for c in configs if c.colocated)
    where = Where(("host1", "host2", "host3", "host4"), ("a1", "a2", "a3", "a4"), (), "/cfg", None, None, "py")
    argv = shoal_argv(colocated, where, 40_000)
    assert colocated.hosts == 2 and argv[argv.index("--hosts") + 1] == "host1,host2"


def test_shoal_argv_places_the_job_on_its_hosts_and_forces_plain_only_when_asked():
    where = Where(("host1", "host2", "host3", "host4"), ("a1", "a2", "a3", "a4"), (), "/cfg", None, None, "py")
    config = Config(System.SHOAL_SSH, "mlp", "sync", 1, 2, "1gbit", "plain")
    argv = shoal_argv(config, where, 40_000)
    assert argv[argv.index("--hosts") + 1] == "host1,host2,host3"
    assert argv[argv.index("--steps") + 1] == str(steps_for(config, 40_000)) == "200"  # 2 workers' batches a step
    assert argv[-2:] == ("--wire_security", "plain") and "--sync" in argv
    local = shoal_argv(Config(System.SHOAL_LOCAL, "mlp", "async", 1, 2, "loopback", "plain"), where, 40_000)
    assert "--hosts" not in local and "--wire_security" not in local


def _task(name, lines):
    return Task(name, subprocess.Popen.__new__(subprocess.Popen), lines=lines)


def test_measure_counts_the_window_and_finds_the_busiest_link_and_its_bound():
    config = Config(System.SHOAL_SSH, "mlp", "sync", 1, 2, "1gbit", "curve")
    lines = [(10.0 + i * 0.1, f"mh.worker.{w} | worker:{w} step={i} loss=0.1 examples/s=5") for i in range(50)
             for w in (0, 1)]
    sampled = Sampled()
    # host1 (the ps) receives 10 MB/s, host2 2 MB/s; tbf counts 5% more than the interface.
    sampled.link_bytes = {("host1", "in"): [(0.0, 0), (20.0, 200e6)], ("host2", "in"): [(0.0, 0), (20.0, 40e6)]}
    sampled.tbf_bytes = {("host1", "in"): (0, 105), ("host2", "in"): (0, 105)}
    sampled.iface_bytes = {("host1", "in"): (0, 100), ("host2", "in"): (0, 100)}
    cores = os.cpu_count()
    sampled.machine_cpu = [(0.0, 0.0), (20.0, 20.0 * cores)]  # every core busy
    sampled.process_cpu = {7: [(0.0, 0.0), (20.0, 10.0)]}
    sampled.roles = {7: "ps"}
    run = measure(config, [_task("shoal", lines)], {"shoal": 0}, sampled, 20.0)
    assert run["ok"] and run["window_s"] == pytest.approx(4.4)  # from the 6th line (10%) to the last
    examples = 44 * 2 * 4 * 100  # lines in the window x log_every (mlp: 4) x batch
    assert run["examples"] == examples and run["busiest_link"] == "host1 in"
    per_example = 10e6 * 4.4 * 1.05 / examples
    assert run["bytes_per_example"] == pytest.approx(per_example, rel=1e-3)
    assert run["link_bound_examples_per_s"] == pytest.approx(125e6 / per_example, rel=1e-3)
    assert run["cpu_us_per_example"]["ps"] == pytest.approx(0.5 * 4.4 / examples * 1e6, abs=0.1)
    assert run["busy_share"] == pytest.approx(1.0)
    assert run["others_share"] == pytest.approx((cores - 0.5) / cores, abs=1e-3)  # all but the ps's half core


def test_measure_reports_a_failed_run_with_the_tasks_output():
    config = Config(System.DDP, "softmax", "sync", 0, 2, "1gbit", "-")
    run = measure(config, [_task("rank0", [(1.0, "boom")]), _task("rank1", [])], {"rank0": 1, "rank1": None},
                  Sampled(), 3.0)
    assert not run["ok"] and "boom" in run["error"]["rank0"]


def _run(key, n, eps):
    return {"key": key, "round": n, "ok": True, "examples_per_s": eps}


def test_ratio_is_the_median_of_within_round_ratios_and_skips_rounds_missing_a_side():
    runs = [_run("a", 0, 100), _run("b", 0, 50), _run("a", 1, 90), _run("b", 1, 90), _run("a", 2, 10)]
    found = report.ratio(runs, "a", "b")
    assert found["per_round"] == [2.0, 1.0] and found["ratio"] == 1.5


def test_goals_compare_with_ddp_only_with_as_many_ps_as_workers():
    summary = [{"key": "s", "system": "shoal-ssh", "model": "mlp", "mode": "sync", "shape": "2ps+2w",
                "fraction_of_link_bound": 0.9, "link_bound_examples_per_s": 1000}]
    found = {"vs_ddp": [{"top": "x", "bottom": "d", "ratio": 1.2, "same_ps_and_workers": True},
                        {"top": "y", "bottom": "d", "ratio": 0.5, "same_ps_and_workers": False}]}
    goals = report.goals(summary, found)
    assert [(g["key"], g["met"]) for g in goals["fraction_of_link_bound"]] == [("s", True)]
    assert [g["key"] for g in goals["vs_ddp_same_ps_and_workers"]] == ["x"]


def test_goals_mark_a_link_bound_above_the_loopback_rate_as_cpu_bound_here():
    row = {"system": "shoal-ssh", "model": "mlp", "mode": "sync", "shape": "1ps+2w"}
    summary = [dict(row, key="fast link", fraction_of_link_bound=0.1, link_bound_examples_per_s=150_000),
               dict(row, key="slow link", fraction_of_link_bound=0.5, link_bound_examples_per_s=15_000),
               dict(row, key="local", system="shoal-local", examples_per_s=30_000)]
    goals = report.goals(summary, {"vs_ddp": []})["fraction_of_link_bound"]
    assert [(g["key"], g["cpu_bound_here"], g["met"]) for g in goals] == [("fast link", True, False),
                                                                         ("slow link", False, False)]


def test_whole_push_twins_run_only_on_their_links_and_send_one_message_per_ps():
    configs = plan.matrix(["mlp"], ["sync"], ["1ps+2w"], ["1gbit", "unshaped"], [], [], loopback=False,
                          whole_push_links=["1gbit"])
    keys = [c.key for c in configs]
    assert keys == ["shoal-ssh mlp sync 1ps+2w 1gbit curve", "shoal-ssh mlp sync 1ps+2w 1gbit curve whole-push",
                    "shoal-ssh mlp sync 1ps+2w unshaped curve"]
    where = Where(("host1", "host2", "host3"), ("a1", "a2", "a3"), (), "/cfg", None, None, "py")
    whole = shoal_argv(configs[1], where, 40_000)
    assert whole[whole.index("--push_part_bytes") + 1] == "0"
    assert "--push_part_bytes" not in shoal_argv(configs[0], where, 40_000)


def test_progress_counts_the_progress_reporters_lines_with_their_step_times():
    """The softmax's lines (shoal.ProgressReporter) carry step_ms=, p95_ms=, applied= after
    examples/s=: they were not counted, and every softmax run was reported FAILED."""
    config = Config(System.SHOAL_SSH, "softmax", "async", 1, 2, "1gbit", "curve")
    lines = [(1.0, "mh.worker.0 | worker:0 step=10 loss=0.3 examples/s=9000 step_ms=0.4 p95_ms=0.9 applied=10/10"),
             (1.1, "mh.worker.1 | worker:1 step=20 loss=0.3 examples/s=9000"),
             (1.2, "mh.worker.0 | worker:0 step=30 loss=0.3 examples/s=9000 checkpoints=2"),
             (1.3, "mh.worker.0 | worker:0 step=40 loss=0.2 final"),
             (1.4, "mh.ps.0 | ps:0 step=40 loss=0.2 examples/s=9000")]
    times, per_line = progress(config, [_task("shoal", lines)])
    assert times == {"worker.0": [1.0, 1.2], "worker.1": [1.1]} and per_line == 10 * 100
