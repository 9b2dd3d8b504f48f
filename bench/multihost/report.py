"""multihost_throughput's summary: medians per configuration, ratios within rounds, goals, and
the Markdown table of bench/results/multihost.md.

A ratio is the median over rounds of the ratio of two configurations' runs in the same round
(minutes apart, under the same load). Goals (issue 11): a cross-host run at >= 0.85 of its link
bound; Shoal with as many ps hosts as workers ahead of DDP (ratio >= 1) on the same links.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from bench import fmt, median_of_present, rounded
from bench.multihost.runs import COLOCATED

GOAL_FRACTION = 0.85
GOAL_VS_DDP = 1.0


def summarize(runs: list[dict]) -> list[dict]:
    """One row per configuration: medians over its successful runs."""
    rows = []
    for key in dict.fromkeys(r["key"] for r in runs):
        group = [r for r in runs if r["key"] == key]
        good = [r for r in group if r["ok"]]
        row = dict(group[0]["config"], key=key, runs=len(group), ok_runs=len(good))
        if good:
            roles = good[0]["cpu_us_per_example"].keys()
            row.update({
                "examples_per_s": rounded(median_of_present(r["examples_per_s"] for r in good)),
                "examples_per_s_all": [r["examples_per_s"] for r in good],
                "bytes_per_example": rounded(median_of_present(r["bytes_per_example"] for r in good)),
                "busiest_link": good[0]["busiest_link"],
                "link_bound_examples_per_s": rounded(median_of_present(r["link_bound_examples_per_s"] for r in good)),
                "fraction_of_link_bound": rounded(median_of_present(r["fraction_of_link_bound"] for r in good), 3),
                "fraction_all": [r["fraction_of_link_bound"] for r in good],
                "utilization": ({d: rounded(median_of_present(r["busiest_host_link_utilization"][d] for r in good), 2)
                                 for d in good[0]["busiest_host_link_utilization"]}
                                if good[0].get("busiest_host_link_utilization") else None),
                "cpu_us_per_example_total": rounded(median_of_present(r["cpu_us_per_example_total"] for r in good), 1),
                "cpu_us_per_example": {role: rounded(median_of_present(r["cpu_us_per_example"][role] for r in good), 1)
                                       for role in roles},
                "busy_share": rounded(median_of_present(r["busy_share"] for r in good), 2),
                "others_share": rounded(median_of_present(r["others_share"] for r in good), 2),
                "accuracy_min": min((r["accuracy_min"] for r in good if r["accuracy_min"] is not None), default=None),
            })
        rows.append(row)
    return rows


def _by_round(runs: list[dict]) -> dict[tuple[int, str], dict]:
    return {(r["round"], r["key"]): r for r in runs if r["ok"]}


def ratio(runs: list[dict], top: str, bottom: str) -> dict | None:
    """Median over rounds of examples/s of `top` / `bottom` (both keys) in the same round."""
    index = _by_round(runs)
    values = [index[(n, top)]["examples_per_s"] / index[(n, bottom)]["examples_per_s"]
              for n in sorted({r["round"] for r in runs})
              if (n, top) in index and (n, bottom) in index and index[(n, bottom)]["examples_per_s"]]
    if not values:
        return None
    return {"top": top, "bottom": bottom, "ratio": round(statistics.median(values), 3),
            "per_round": [round(v, 3) for v in values]}


def _wire(row: dict) -> str:
    """The table's wire column: the security, and "whole push" for a run that sent one push message per ps."""
    return row["security"] + (", whole push" if row.get("push") == "whole" else "")


def _key(system, model, mode, shape, link, security) -> str:
    return f"{system} {model} {mode} {shape} {link} {security}"


def ratios(runs: list[dict], summary: list[dict]) -> dict[str, list[dict]]:
    """vs_loopback (ssh CURVE / local), plain_vs_curve, vs_ddp (Shoal over DDP, same link,
    same number of workers), each a list of `ratio` results."""
    keys = {row["key"] for row in summary}
    out: dict[str, list[dict]] = {"vs_loopback": [], "plain_vs_curve": [], "parts_vs_whole": [], "vs_ddp": []}

    def add(name: str, top: str, bottom: str, extra: Callable[[], dict] = dict) -> None:
        if top in keys and bottom in keys and (found := ratio(runs, top, bottom)):
            out[name].append(dict(found, **extra()))

    for row in summary:
        if row["system"] != "shoal-ssh":
            continue
        model, mode, shape, link, security = row["model"], row["mode"], row["shape"], row["link"], row["security"]
        if row.get("push") == "whole":
            continue
        if security == "curve":
            add("vs_loopback", row["key"], _key("shoal-local", model, mode, shape.removesuffix(COLOCATED), "loopback",
                                                "plain"))
            add("parts_vs_whole", row["key"], row["key"] + " whole-push")
            add("plain_vs_curve", _key("shoal-ssh", model, mode, shape, link, "plain"), row["key"])
        add("vs_ddp", row["key"], _key("ddp", model, "sync", f"{row['workers']}w", link, "-"),
            lambda: {"same_ps_and_workers": row["ps"] == row["workers"]})
    return out


def goals(summary: list[dict], found: dict[str, list[dict]]) -> dict:
    """Each goal per configuration. A link bound above what the same job does on loopback (all
    tasks on this machine's cores, no link at all) cannot be reached here: such a row says
    `cpu_bound_here` and its loopback rate, so the fraction is read as a CPU limit, not the link's."""
    loopback = {(row["model"], row["mode"], row["shape"]): row.get("examples_per_s")
                for row in summary if row["system"] == "shoal-local"}
    fractions = []
    for row in summary:
        if row["system"] != "shoal-ssh" or not row.get("fraction_of_link_bound"):
            continue
        local = loopback.get((row["model"], row["mode"], row["shape"].removesuffix(COLOCATED)))
        fractions.append({"key": row["key"], "fraction": row["fraction_of_link_bound"],
                          "met": row["fraction_of_link_bound"] >= GOAL_FRACTION,
                          "loopback_examples_per_s": local,
                          "cpu_bound_here": bool(local and row["link_bound_examples_per_s"] > local)})
    vs_ddp = [{"key": r["top"], "vs": r["bottom"], "ratio": r["ratio"], "met": r["ratio"] >= GOAL_VS_DDP}
              for r in found["vs_ddp"] if r["same_ps_and_workers"]]
    return {"fraction_of_link_bound": fractions, "vs_ddp_same_ps_and_workers": vs_ddp,
            "goal_fraction": GOAL_FRACTION, "goal_vs_ddp": GOAL_VS_DDP}


def _fmt(value, spec: str = "", empty: str = "") -> str:
    return fmt(value, spec, empty)


def markdown(result: dict) -> str:
    """The report: the machine, the references, one row per configuration, the ratios, goals."""
    m = result["machine"]
    lines = [f"# multihost_throughput, {m['date']}", "",
             f"{m['cpus']} cores, Python {m['python']}, {m['platform']}; load average {m['loadavg_1m_at_start']} at "
             f"the start, {result['loadavg_1m_at_end']} at the end; {result['rounds']} rounds, "
             f"{result['bench_wall_s']:.0f} s in all. Examples per run: {result['examples_per_run']}.", ""]
    if result.get("tcp_reference"):
        lines += ["Raw TCP, one stream host2 -> host1 (payload MB/s; bytes tbf counted / rate), per round:", ""]
        for link, refs in result["tcp_reference"].items():
            shown = ", ".join(f"{r.get('payload_mb_per_s')} MB/s" + (f" ({r['tbf_fraction_of_rate']:.2f} of the rate)"
                                                                       if "tbf_fraction_of_rate" in r else "")
                              for r in refs)
            lines.append(f"- {link}: {shown}")
        lines.append("")
    lines += ["| system | model | mode | shape | link | wire | examples/s | link bound | fraction | busiest link: "
              "KB per 100 ex (in/out full) | CPU us/ex (ps/worker/agent+sshd/launcher) | busy | others | acc |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["summary"]:
        if not row.get("examples_per_s"):
            lines.append(f"| {row['system']} | {row['model']} | {row['mode']} | {row['shape']} | {row['link']} | "
                         f"{_wire(row)} | FAILED ({row['ok_runs']}/{row['runs']} ok) | | | | | | | |")
            continue
        cpu = row["cpu_us_per_example"]
        kb_step = row["bytes_per_example"] * 100 / 1000 if row["bytes_per_example"] else None
        use = row.get("utilization")
        busiest = f"{row['busiest_link']}" + (f", {use['in']:.2f}/{use['out']:.2f}" if use else "")
        lines.append(
            f"| {row['system']} | {row['model']} | {row['mode']} | {row['shape']} | {row['link']} | {_wire(row)} | "
            f"{row['examples_per_s']:,} | {_fmt(row['link_bound_examples_per_s'], ',')} | "
            f"{_fmt(row['fraction_of_link_bound'], '.2f')} | {_fmt(kb_step, '.0f')} ({busiest}) | "
            f"{row['cpu_us_per_example_total']:.0f} ({cpu['ps']:.0f}/{cpu['worker']:.0f}/"
            f"{cpu['agent'] + cpu['sshd']:.0f}/{cpu['launcher']:.0f}) | {row['busy_share']:.2f} | "
            f"{row['others_share']:.2f} | {_fmt(row['accuracy_min'], '.3f')} |")
    for name, title in (("vs_loopback", "Across hosts (CURVE) / the same job on loopback"),
                        ("plain_vs_curve", "PLAIN / CURVE between hosts (the cost of encryption)"),
                        ("parts_vs_whole", "push in parts / one push message per ps (the gain of overlapping "
                                           "upload and download)"),
                        ("vs_ddp", "Shoal / torch DDP (gloo), same links, same number of workers")):
        if result["ratios"][name]:
            lines += ["", f"{title} (median over rounds of the ratio within a round):", ""]
            lines += [f"- {r['top']} / {r['bottom']}: **{r['ratio']:.2f}** (rounds: "
                      f"{', '.join(f'{v:.2f}' for v in r['per_round'])})" for r in result["ratios"][name]]
    g = result["goals"]
    lines += ["", f"Goals: fraction of the link bound >= {g['goal_fraction']} (shaped links); with as many ps "
                  f"hosts as workers, Shoal / DDP >= {g['goal_vs_ddp']}.", ""]
    lines += [f"- {x['key']}: {x['fraction']:.2f} ({'met' if x['met'] else 'MISSED'})"
              + (f"; not reachable here: the bound is above the same job on loopback ({x['loopback_examples_per_s']:,}"
                 " examples/s, CPU-bound)" if x["cpu_bound_here"] else "")
              for x in g["fraction_of_link_bound"]]
    lines += [f"- {x['key']} / DDP: {x['ratio']:.2f} ({'met' if x['met'] else 'MISSED'})"
              for x in g["vs_ddp_same_ps_and_workers"]]
    return "\n".join(lines) + "\n"
