"""Cross-host throughput of the seed softmax and the MLP over the SSH executor, next to the same
job on loopback and to PyTorch DDP (gloo) on the same hosts and links (issue 11).

    sudo .venv/bin/python -m bench.multihost_throughput [--json]        # ~20 min, as root
    python -m bench.multihost_throughput --dry-run                      # the schedule; runs nothing
        [--models softmax,mlp] [--modes async,sync,async-overlap] [--shapes 1ps+2w,2ps+2w,2ps+2w/colocated]
        [--links 1gbit,10gbit,unshaped] [--plain-links 1gbit,unshaped] [--whole-push-links 1gbit]
        [--ddp-workers 2,4]
        [--no-loopback] [--rounds 2] [--examples softmax=250000,mlp=50000] [--out DIR] [--out-name NAME]

Hosts are network namespaces with their own sshd on this machine, made with the multi-host
test fixtures (tests/multihost: HostNetwork, Host.shape = tbf both ways on each host's link),
one task per host: 1 ps + 2 workers on 3 hosts, 2 ps + 2 workers on 4; a `/colocated` shape puts
ps.i and worker.i on host i+1 (2 ps + 2 workers on 2 hosts). Every configuration is
a real job: `shoal run --hosts ... --ssh-config ...` (CURVE between hosts, or PLAIN with the
examples' `--wire_security plain`), the same `shoal run` without --hosts (loopback), and
bench/peers/torch_ddp.py with 2 and 4 ranks inside the hosts (`ip netns exec`). Rounds run
every configuration once, interleaved (bench/multihost/plan.py); figures are medians over
rounds, ratios medians of within-round ratios. What each figure means: bench/multihost/runs.py
and bench/README.md. Writes bench/results/multihost.{json,md}; the hosts are deleted at the end,
also on failure (and by the next run of the fixtures if this one is killed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/multihost_throughput.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import REPO, machine  # noqa: E402
from bench.multihost import plan, report  # noqa: E402
from bench.multihost.reference import tcp_reference  # noqa: E402
from bench.example_modes import MODE_FLAGS  # noqa: E402
from bench.multihost.runs import EXAMPLES, RATES_BPS, System, Where, run_config  # noqa: E402
from bench.multihost.sampler import Link  # noqa: E402

DEFAULT_EXAMPLES = {"softmax": 250_000, "mlp": 50_000}  # a window of ~3 s at the rates seen here


def _list(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="softmax,mlp")
    parser.add_argument("--modes", default="async,sync", help="of async, sync, async-overlap (--overlap_push)")
    parser.add_argument("--shapes", default="1ps+2w,2ps+2w,2ps+2w/colocated",
                        help="ps+workers, one task per host; NpsNw/colocated: one ps and one worker per host")
    parser.add_argument("--links", default=",".join(plan.LINKS), help=f"of {', '.join(plan.LINKS)}")
    parser.add_argument("--plain-links", default="1gbit,unshaped",
                        help="links on which Shoal also runs with --wire_security plain (the cost of CURVE)")
    parser.add_argument("--whole-push-links", default="1gbit",
                        help="links on which Shoal also runs with --push_part_bytes 0 (the gain of pushing in parts)")
    parser.add_argument("--ddp-workers", default="2,4", help="torch DDP world sizes ('' for none)")
    parser.add_argument("--no-loopback", action="store_true", help="leave out the shoal-local runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--examples", default=",".join(f"{k}={v}" for k, v in DEFAULT_EXAMPLES.items()),
                        help="examples per run, per model")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--out-name", default="multihost", help="writes OUT/NAME.json and OUT/NAME.md")
    parser.add_argument("--ddp-python", default="", help="interpreter of the DDP ranks (default: the peers' "
                        "venv bench/.peers-venv when it exists, else this one; either needs torch)")
    parser.add_argument("--json", action="store_true", help="end with one line holding the JSON result")
    parser.add_argument("--dry-run", action="store_true", help="print the schedule and exit")
    args = parser.parse_args(argv)
    args.examples = {k: int(v) for k, v in (item.split("=") for item in _list(args.examples))}
    bad = [m for m in _list(args.models) if m not in EXAMPLES]
    bad += [link for link in _list(args.links) + _list(args.plain_links) + _list(args.whole_push_links)
            if link not in plan.LINKS]
    bad += [mode for mode in _list(args.modes) if mode not in MODE_FLAGS]
    if bad or set(_list(args.models)) - set(args.examples):
        parser.error(f"unknown model, mode or link {bad}, or a model without --examples; models: "
                     f"{', '.join(EXAMPLES)}, modes: {', '.join(MODE_FLAGS)}, links: {', '.join(plan.LINKS)}")
    return args


def ddp_python(chosen: str) -> str:
    if chosen:
        return chosen
    peers = REPO / "bench" / ".peers-venv" / "bin" / "python"
    return str(peers) if peers.exists() else sys.executable


def shape_links(hosts, link: str) -> None:
    for host in hosts:
        if link in RATES_BPS:
            host.shape(link)
        else:
            host.unshape()


def main(argv=None) -> int:
    args = parse_args(argv)
    configs = plan.matrix(_list(args.models), _list(args.modes), _list(args.shapes), _list(args.links),
                          _list(args.plain_links), [int(n) for n in _list(args.ddp_workers)],
                          loopback=not args.no_loopback, whole_push_links=_list(args.whole_push_links))
    schedule = plan.rounds(configs, args.rounds)
    if args.dry_run:
        for n, order in enumerate(schedule):
            print(f"round {n}: " + "\n         ".join(c.key for c in order))
        print(f"{len(configs)} configurations x {args.rounds} rounds")
        return 0
    from tests.multihost import requirements
    from tests.multihost.network import HostNetwork
    if reason := requirements.hosts_unavailable():
        print(f"multihost_throughput: cannot make hosts here: {reason}", file=sys.stderr)
        return 2
    from shoal.datasets.mnist import default_cache_dir, load_mnist
    mnist_dir = default_cache_dir(os.environ)
    load_mnist(mnist_dir)  # the .npy cache, before any run

    started = time.monotonic()
    info = machine()
    print(f"multihost_throughput: {len(configs)} configurations x {args.rounds} rounds, {info['cpus']} cpus, "
          f"load {info['loadavg_1m_at_start']}", flush=True)
    network = HostNetwork()
    runs: list[dict] = []
    tcp_refs: dict[str, list[dict]] = {}
    try:
        network.start()
        count = max([2] + [c.hosts for c in configs])
        hosts = [network.add_host() for _ in range(count)]
        links = tuple(Link(h.name, h.veth, h.netns) for h in hosts)
        with tempfile.TemporaryDirectory(prefix="shoal-bench-mh-") as home:
            where = Where(tuple(h.name for h in hosts), tuple(h.address for h in hosts), links,
                          str(network.ssh_config), Path(home), mnist_dir, ddp_python(args.ddp_python))
            for n, order in enumerate(schedule):
                shaped = None
                for config in order:
                    if config.link != shaped and config.system is not System.SHOAL_LOCAL:
                        shape_links(hosts, config.link)
                        shaped = config.link
                        ref = tcp_reference(links[0], hosts[0].address, links[1], RATES_BPS.get(config.link))
                        tcp_refs.setdefault(config.link, []).append(ref)
                        print(f"  round {n} {config.link}: raw TCP {ref}", flush=True)
                    run = run_config(config, where, args.examples[config.model], args.timeout)
                    run["round"] = n
                    runs.append(run)
                    print(f"  round {n} {config.key}: " + (
                        f"{run['examples_per_s']} ex/s, bound {run['link_bound_examples_per_s']}, fraction "
                        f"{run['fraction_of_link_bound']}, {run['cpu_us_per_example_total']} us/ex, busy "
                        f"{run['busy_share']}, wall {run['wall_s']} s" if run["ok"]
                        else f"FAILED {run['exit_codes']}\n{json.dumps(run.get('error'), indent=1)[-3000:]}"),
                        flush=True)
            shape_links(hosts, "unshaped")
    finally:
        network.close()
    summary = report.summarize(runs)
    found = report.ratios(runs, summary)
    result = {"summary": summary, "ratios": found, "goals": report.goals(summary, found), "runs": runs,
              "tcp_reference": tcp_refs, "rounds": args.rounds, "examples_per_run": args.examples,
              "ddp_python": ddp_python(args.ddp_python), "machine": info,
              "loadavg_1m_at_end": round(os.getloadavg()[0], 2), "bench_wall_s": round(time.monotonic() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    text = report.markdown(result)
    (args.out / f"{args.out_name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.out_name}.md").write_text(text)
    print(text, flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
