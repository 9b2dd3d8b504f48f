"""Summaries of the runs: medians per (system, model), Shoal/peer ratios taken within each
interleaved pair, the issue's goals, Shoal's scaling, and the markdown table. Pure functions.
"""

from __future__ import annotations

import statistics

from bench import fmt, median_of_present, rounded
from bench.peers.systems import SYSTEMS

# (Shoal system, peer, minimum Shoal/peer throughput ratio), on the softmax (issue 5; issue 15: in-graph
# Shoal >= 3x TF2's coordinator at the same steps per dispatch, and at K=10 >= 0.8x Shoal between-graph)
GOALS = [("shoal-async", "tf1-async", 3.0), ("shoal-async", "tf2-ps-k10", 2.0), ("shoal-sync", "tf1-sync", 3.0),
         ("shoal-sync", "tf-mwms", 1.0), ("shoal-sync", "torch-ddp", 1.0),
         ("shoal-coord-k1", "tf2-ps-k1", 3.0), ("shoal-coord-k10", "tf2-ps-k10", 3.0),
         ("shoal-coord-k10", "shoal-async", 0.8)]
GOAL_PS_RSS_FRACTION = 0.2  # a Shoal ps <= 1/5 of a TensorFlow ps
TF_PS_SYSTEMS = ("tf1-async", "tf1-sync", "tf2-ps-k1", "tf2-ps-k10")


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (system, model), in order of first appearance: medians over its ok runs."""
    out = []
    for key in dict.fromkeys((r["system"], r["model"]) for r in runs if r.get("phase") == "compare"):
        group = [r for r in runs if (r["system"], r["model"]) == key and r.get("phase") == "compare"]
        good = [r for r in group if r["ok"]]
        row = {"system": key[0], "model": key[1], "runs": len(group), "ok_runs": len(good)}
        if good:
            row.update({
                "examples_per_s": rounded(median_of_present([r["examples_per_s"] for r in good])),
                "examples_per_s_all": [r["examples_per_s"] for r in good],
                "first_step_s": rounded(median_of_present([r["first_step_s"] for r in good]), 2),
                "time_to_090_s": rounded(median_of_present([r["time_to_090_s"] for r in good]), 2),
                "reached_090": sum(r["time_to_090_s"] is not None for r in good),
                "s90": median_of_present([r["s90"] for r in good]),
                "peak_rss_mb_ps": _max(good, "peak_rss_mb_ps"),
                "peak_rss_mb_worker": _max(good, "peak_rss_mb_worker"),
                "peak_rss_mb_chief": _max(good, "peak_rss_mb_chief"),
                "cpu_s_per_1k_examples": rounded(median_of_present([r["cpu_s_per_1k_examples"] for r in good]), 3),
                "cpu_share_others": rounded(median_of_present([r["cpu_share_others"] for r in good]), 2),
                "eval_s_in_window": rounded(median_of_present([r["eval_s_in_window"] for r in good]), 3),
                "window_s": rounded(median_of_present([r["window_s"] for r in good]), 2),
                "accuracy_min": min((r["accuracy"] for r in good if r["accuracy"] is not None), default=None),
            })
        out.append(row)
    return out


def _max(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return max(values) if values else None


def ratios(runs: list[dict], pairs: list[dict]) -> list[dict]:
    """Shoal/peer examples/s per pair (adjacent runs), median over rounds, per (peer, model)."""
    by_key: dict[tuple, list[float]] = {}
    for pair in pairs:
        shoal, peer = runs[pair["shoal"]], runs[pair["peer"]]
        if shoal["ok"] and peer["ok"] and peer["examples_per_s"]:
            by_key.setdefault((shoal["system"], peer["system"], peer["model"]), []).append(
                shoal["examples_per_s"] / peer["examples_per_s"])
    goals = {(s, p): g for s, p, g in GOALS}
    out = []
    for (shoal, peer, model), values in by_key.items():
        goal = goals.get((shoal, peer)) if model == "softmax" else None
        ratio = statistics.median(values)
        out.append({"shoal": shoal, "peer": peer, "model": model, "ratio": round(ratio, 2),
                    "ratio_all": [round(v, 2) for v in values], "goal": goal,
                    "goal_met": (ratio >= goal) if goal is not None else None})
    return out


def rss_goal(summary: list[dict]) -> list[dict]:
    """Per model: Shoal's largest ps against the smallest TensorFlow ps."""
    out = []
    for model in dict.fromkeys(s["model"] for s in summary):
        rows = {s["system"]: s for s in summary if s["model"] == model and s.get("peak_rss_mb_ps")}
        shoal = [rows[s]["peak_rss_mb_ps"] for s in ("shoal-async", "shoal-sync") if s in rows]
        tf = {s: rows[s]["peak_rss_mb_ps"] for s in TF_PS_SYSTEMS if s in rows}
        if shoal and tf:
            smallest = min(tf.values())
            out.append({"model": model, "shoal_ps_mb": max(shoal), "tf_ps_mb": tf,
                        "fraction": round(max(shoal) / smallest, 3), "goal": GOAL_PS_RSS_FRACTION,
                        "goal_met": max(shoal) <= GOAL_PS_RSS_FRACTION * smallest})
    return out


def scaling(runs: list[dict]) -> list[dict]:
    """Shoal with 1, 2, 4 workers: median examples/s, and efficiency = (n-worker examples/s /
    1-worker examples/s, within a round, median over rounds) / n."""
    rows = [r for r in runs if r.get("phase") == "scaling" and r["ok"]]
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        base = {r["round"]: r["examples_per_s"] for r in rows if r["system"] == system and r["workers"] == 1}
        for n in sorted({r["workers"] for r in rows if r["system"] == system}):
            mine = [r for r in rows if r["system"] == system and r["workers"] == n]
            speedups = [r["examples_per_s"] / base[r["round"]] for r in mine if base.get(r["round"])]
            speedup = median_of_present(speedups)
            out.append({"system": system, "model": mine[0]["model"], "workers": n,
                        "examples_per_s": rounded(median_of_present([r["examples_per_s"] for r in mine])),
                        "speedup": rounded(speedup, 2), "efficiency": rounded(speedup / n, 2) if speedup else None,
                        "cpu_s_per_1k_examples": rounded(median_of_present([r["cpu_s_per_1k_examples"] for r in mine]), 3),
                        "cpu_share_others": rounded(median_of_present([r["cpu_share_others"] for r in mine]), 2)})
    return out


def _fmt(value, spec=""):
    return fmt(value, spec, "n/a")


def markdown(summary, ratio_rows, rss_rows, scaling_rows, ladder, machine: dict) -> str:
    """The tables bench/README.md keeps: a row per system (its "Shoal / it" cell: the Shoal system
    a peer is compared with over the peer), then every ratio, the Shoal systems' own references
    (in-graph Shoal against TF2 and between-graph Shoal) included."""
    compared = {name: s.compare_with for name, s in SYSTEMS.items()}
    ratio_of = {(r["peer"], r["model"]): r for r in ratio_rows if compared.get(r["peer"]) == r["shoal"]}
    lines = [f"{machine.get('date')}, {machine.get('cpus')} cores, load average at start "
             f"{machine.get('loadavg_1m_at_start')}; figures are medians over interleaved rounds.", "",
             "| system | model | examples/s | Shoal / it (goal) | first step s | to 0.90 s (S90) | ps RSS MB | "
             "worker RSS MB | chief RSS MB | CPU s / 1k ex | others | acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if not s.get("ok_runs"):
            lines.append(f"| {s['system']} | {s['model']} | FAILED ({s['runs']} runs) | | | | | | | | | |")
            continue
        ratio = ratio_of.get((s["system"], s["model"]))
        cell = ""
        if ratio:
            cell = f"{ratio['ratio']:.2f}x"
            if ratio["goal"] is not None:
                cell += f" (>= {ratio['goal']:g}: {'met' if ratio['goal_met'] else '**missed**'})"
        s90 = s["s90"]
        lines.append(
            f"| {s['system']} | {s['model']} | {s['examples_per_s']:,} | {cell} | {s['first_step_s']:.2f} | "
            f"{_fmt(s['time_to_090_s'], '.2f')} ({_fmt(int(s90) if s90 is not None else None)}) | "
            f"{_fmt(s['peak_rss_mb_ps'], '.0f')} | {_fmt(s['peak_rss_mb_worker'], '.0f')} | "
            f"{_fmt(s['peak_rss_mb_chief'], '.0f')} | {_fmt(s['cpu_s_per_1k_examples'], '.3f')} | "
            f"{_fmt(s['cpu_share_others'], '.2f')} | {_fmt(s['accuracy_min'], '.3f')} |")
    others = [r for r in ratio_rows if ratio_of.get((r["peer"], r["model"])) is not r]
    if others:
        lines += ["", "| Shoal system | against | model | ratio (per round) | goal |", "|---|---|---|---|---|"]
        for r in others:
            goal = "" if r["goal"] is None else f">= {r['goal']:g}: {'met' if r['goal_met'] else '**missed**'}"
            per_round = " / ".join(f"{v:.2f}" for v in r["ratio_all"])
            lines.append(f"| {r['shoal']} | {r['peer']} | {r['model']} | {r['ratio']:.2f}x ({per_round}) | {goal} |")
    if rss_rows:
        lines += ["", "| model | Shoal ps MB | TF ps MB | Shoal / smallest TF ps (goal <= 0.2) |", "|---|---|---|---|"]
        for r in rss_rows:
            tf = ", ".join(f"{k} {v:.0f}" for k, v in r["tf_ps_mb"].items())
            lines.append(f"| {r['model']} | {r['shoal_ps_mb']:.0f} | {tf} | {r['fraction']:.3f} "
                         f"({'met' if r['goal_met'] else '**missed**'}) |")
    if scaling_rows:
        lines += ["", f"Shoal scaling, softmax, 2 ps ({machine.get('cpus')} cores: more than 2 busy processes share "
                      "them, so efficiency falls by construction):", "",
                  "| system | workers | examples/s | speedup vs 1 | efficiency | CPU s / 1k ex | others |",
                  "|---|---|---|---|---|---|---|"]
        for r in scaling_rows:
            lines.append(f"| {r['system']} | {r['workers']} | {_fmt(r['examples_per_s'], ',')} | "
                         f"{_fmt(r['speedup'], '.2f')} | {_fmt(r['efficiency'], '.2f')} | "
                         f"{_fmt(r['cpu_s_per_1k_examples'], '.3f')} | {_fmt(r['cpu_share_others'], '.2f')} |")
    if ladder:
        lines += ["", "Shoal's S90 (global steps to 0.90, from runs of fixed length): " + "; ".join(
            f"{k} {v['s90']} ({', '.join(f'{s}: {a:.3f}' for s, a in v['points'])})" for k, v in ladder.items())]
    return "\n".join(lines) + "\n"
